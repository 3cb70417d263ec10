// Communication hooks and a joined rank's shadow backward on the Reducer, at world size 1: each
// bucket goes to the hook in plan order and its result becomes the gradients; a future that never
// completes is a CommError naming the bucket within the timeout; misuse is a ConfigError; the
// shadow backward reduces zeros per bucket and leaves this rank's gradients alone.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <functional>

#include "dtcore/common/error.h"
#include "dtcore/reducer/reducer.h"
#include "expect_error.h"
#include "reducer_test_util.h"

using namespace dtcore;
using namespace dtcore::testing;

namespace {

// A C++ hook (the Python ones arrive as torch's PythonCommHook, the same interface).
class FnHook : public c10d::CommHookInterface {
 public:
  explicit FnHook(std::function<HookFuture(c10d::GradBucket&)> fn) : fn_(std::move(fn)) {}
  HookFuture runHook(c10d::GradBucket& bucket) override { return fn_(bucket); }
  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }

 private:
  std::function<HookFuture(c10d::GradBucket&)> fn_;
};

HookFuture pending() { return c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get()); }

HookFuture completed(const at::Tensor& value) {
  HookFuture f = pending();
  f->markCompleted(value);
  return f;
}

}  // namespace

TEST(ReducerHooks, EachBucketGoesToTheHookInPlanOrderAndItsResultBecomesTheGradients) {
  Fixture f(two_buckets());
  auto expected = reference_grads(f.params, f.x);
  std::vector<size_t> indices;
  f.reducer->register_comm_hook(std::make_unique<FnHook>([&](c10d::GradBucket& b) {
    indices.push_back(b.getIndex());
    EXPECT_EQ(b.isLast(), b.getIndex() + 1 == f.reducer->buckets().size());
    auto grads = b.getGradients();
    auto params = b.getParameters();
    EXPECT_EQ(grads.size(), params.size());
    for (size_t k = 0; k < grads.size(); ++k) EXPECT_EQ(grads[k].sizes(), params[k].sizes());
    return completed(b.getBuffer() * 2);  // a new tensor: copied into the bucket
  }));
  f.step();
  ASSERT_GT(f.reducer->buckets().size(), 1u);
  std::vector<size_t> in_order(f.reducer->buckets().size());
  for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
  EXPECT_EQ(indices, in_order);
  EXPECT_EQ(f.comm->count(CollectiveKind::AllReduce), 0);  // the hook replaced the reducer's own
  for (auto& g : expected) g = g * 2;
  expect_grads(f.params, expected);
  EXPECT_EQ(f.reducer->reductions(), 1);
}

TEST(ReducerHooks, AFutureThatNeverCompletesIsACommErrorNamingTheBucketWithinTheTimeout) {
  Fixture f;  // the communicator's timeout: 1 s
  f.reducer->register_comm_hook(std::make_unique<FnHook>([](c10d::GradBucket&) { return pending(); }));
  const auto start = std::chrono::steady_clock::now();
  std::string m = error_of<CommError>([&] { f.step(); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_contains(m, {"the communication hook's future for bucket 1/1 did not complete on rank 0",
                      "within the timeout (1 s)", "Fix:"});
  EXPECT_GT(seconds, 0.9);
  EXPECT_LT(seconds, 5.0);
}

TEST(ReducerHooks, AFutureWithAnErrorIsACommErrorWithItsMessage) {
  Fixture f;
  f.reducer->register_comm_hook(std::make_unique<FnHook>([](c10d::GradBucket&) {
    HookFuture fut = pending();
    fut->setError(std::make_exception_ptr(std::runtime_error("peer went away")));
    return fut;
  }));
  expect_contains(error_of<CommError>([&] { f.step(); }), {"bucket 1/1 failed on rank 0", "peer went away"});
}

TEST(ReducerHooks, TwiceAfterTheFirstBackwardWithZeroOrCommDtypeIsRefused) {
  auto identity = [] { return std::make_unique<FnHook>([](c10d::GradBucket& b) { return completed(b.getBuffer()); }); };
  Fixture once;
  once.reducer->register_comm_hook(identity());
  expect_contains(error_of<ConfigError>([&] { once.reducer->register_comm_hook(identity()); }),
                  {"can be called once", "Fix:"});
  Fixture late;
  late.step();
  expect_contains(error_of<ConfigError>([&] { late.reducer->register_comm_hook(identity()); }),
                  {"after the first backward pass", "Fix: register it right after wrapping"});
  Reducer::Options zero;
  zero.zero = 1;
  Fixture sharded(zero);
  expect_contains(error_of<ConfigError>([&] { sharded.reducer->register_comm_hook(identity()); }),
                  {"zero=1", "Fix: wrap with zero=0"});
  Reducer::Options cast;
  cast.comm_dtype = at::kHalf;
  Fixture compressed(cast);
  expect_contains(error_of<ConfigError>([&] { compressed.reducer->register_comm_hook(identity()); }),
                  {"comm_dtype=torch.float16", "fp16_compress_hook"});
}

TEST(ReducerHooks, PostBackwardFuturesAreWaitedForWithTheTimeout) {
  Fixture f;
  f.reducer->prepare_for_backward(true);
  f.reducer->install_post_backward_futures({completed(at::zeros({1})), pending()});
  std::string m = error_of<CommError>([&] { loss_of(f.params, f.x).backward(); });
  expect_contains(m, {"the buffer communication hook's future 2/2 did not complete"});
  f.step();  // the next step waits for nothing of the last one
  EXPECT_EQ(f.reducer->reductions(), 1);
}

TEST(ReducerHooks, ShadowBackwardReducesZerosPerBucketAndLeavesTheGradientsAlone) {
  Fixture f(two_buckets());
  for (auto& p : f.params) p.mutable_grad() = at::full_like(p, 3.0);  // None until a gradient comes (zero=0)
  f.reducer->shadow_backward();
  const size_t buckets = f.reducer->buckets().size();
  ASSERT_EQ(f.comm->reduced().size(), buckets);
  for (const auto& sent : f.comm->reduced()) EXPECT_TRUE(at::equal(sent, at::zeros_like(sent)));
  EXPECT_EQ(f.comm->count(CollectiveKind::Broadcast), 1);  // the bucket rebuild the others do after their first
  EXPECT_TRUE(f.reducer->plan_final());
  for (auto& p : f.params) EXPECT_TRUE(at::equal(p.grad(), at::full_like(p, 3.0)));
  EXPECT_EQ(f.reducer->reductions(), 0);
  f.reducer->shadow_backward();
  EXPECT_EQ(f.comm->count(CollectiveKind::Broadcast), 1);  // once only
  expect_contains(error_of<ConfigError>([&] { f.reducer->set_divisor(2); }), {"set_divisor(2)", "1 to 1 ranks"});
  Reducer::Options zero;
  zero.zero = 2;
  Fixture sharded(zero);
  expect_contains(error_of<ConfigError>([&] { sharded.reducer->shadow_backward(); }),
                  {"uneven inputs (join) with zero=2 are not supported", "Fix:"});
}
