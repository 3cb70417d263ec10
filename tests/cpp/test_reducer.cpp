// The Reducer at world size 1, with real parameters and a real autograd backward: gradients as bucket views,
// equal to plain autograd's; bucket order; no_sync accumulation; unused parameters; options; reductions().
// The communicator is an in-process engine for one rank (averaging over one rank changes nothing), so that
// the reducer's own logic is what is tested; multi-rank reduction runs in the Python multi-process tests.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>

#include "dtcore/common/error.h"
#include "dtcore/reducer/reducer.h"
#include "expect_error.h"
#include "reducer_test_util.h"

using namespace dtcore;
using namespace dtcore::testing;

TEST(Reducer, GradientsEqualPlainAutogradsAfterAReducedBackward) {
  Fixture f;
  auto expected = reference_grads(f.params, f.x);
  f.step();
  expect_grads(f.params, expected);
  EXPECT_EQ(f.reducer->reductions(), 1);
  EXPECT_EQ(f.comm->count(CollectiveKind::AllReduce), static_cast<int>(f.reducer->buckets().size()));
}

TEST(Reducer, EachBucketIsReducedOnceAllItsGradientsAreIn) {
  Fixture f(two_buckets());
  ASSERT_EQ(f.reducer->buckets().size(), 2u);
  EXPECT_EQ(f.reducer->buckets()[0].params, (std::vector<size_t>{2}));
  EXPECT_EQ(f.reducer->buckets()[1].params, (std::vector<size_t>{1, 0}));
  auto g = reference_grads(f.params, f.x);
  f.step();
  auto sent = f.comm->reduced();
  ASSERT_EQ(sent.size(), 2u);  // in plan order, each holding its gradients back to back
  EXPECT_TRUE(at::allclose(sent[0], g[2].flatten(), 1e-5, 1e-6)) << sent[0];
  EXPECT_TRUE(at::allclose(sent[1], at::cat({g[1], g[0].flatten()}), 1e-5, 1e-6)) << sent[1];
}

TEST(Reducer, GradientsAreViewsIntoOneBucketBuffer) {
  Fixture f;
  ASSERT_EQ(f.reducer->buckets().size(), 1u);                       // 28 floats: far below the 1 MiB first bucket
  for (const auto& p : f.params) EXPECT_FALSE(p.grad().defined());  // None until a gradient comes, as torch DDP
  f.step();
  for (const auto& p : f.params) EXPECT_EQ(p.grad().sizes(), p.sizes());
  EXPECT_TRUE(f.params[0].grad().is_alias_of(f.params[2].grad()));
  f.step();
  f.step();
  EXPECT_TRUE(f.params[0].grad().is_alias_of(f.params[1].grad()));  // still, after the rebuild
  EXPECT_TRUE(f.params[0].grad().is_alias_of(f.params[2].grad()));
}

TEST(Reducer, BucketsFollowReverseRegistrationOrderBeforeTheFirstBackward) {
  std::vector<at::Tensor> params;
  for (int i = 0; i < 4; ++i) params.push_back(at::zeros({256}).requires_grad_());  // 1 KiB each
  Reducer r(params, {"a", "b", "c", "d"}, std::make_shared<OneRankCommunicator>(), tiny_buckets());
  ASSERT_EQ(r.buckets().size(), 3u);
  EXPECT_EQ(r.buckets()[0].params, (std::vector<size_t>{3}));
  EXPECT_EQ(r.buckets()[1].params, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(r.buckets()[2].params, (std::vector<size_t>{0}));
  r.prepare_for_backward(false);  // no_sync: the gradients go into their buckets, the plan stays
  (params[0] + params[1] + params[2] + params[3]).sum().backward();
  EXPECT_TRUE(params[2].grad().is_alias_of(params[1].grad()));
  EXPECT_FALSE(params[3].grad().is_alias_of(params[2].grad()));
}

TEST(Reducer, AfterTheFirstReductionBucketsFollowTheObservedReadyOrder) {
  // Registered a, b but used b then a in forward: a's gradient is ready first.
  std::vector<at::Tensor> params{at::full({3}, 2.0).requires_grad_(), at::full({3}, 3.0).requires_grad_()};
  auto comm = std::make_shared<OneRankCommunicator>();
  Reducer r(params, {"a", "b"}, comm, {});
  EXPECT_EQ(r.buckets()[0].params, (std::vector<size_t>{1, 0}));
  at::Tensor x = at::ones({3});
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& p : params) {
      if (p.grad().defined()) p.grad().zero_();
    }
    r.prepare_for_backward(true);
    ((x * params[1]) * params[0]).sum().backward();
    EXPECT_TRUE(at::allclose(params[0].grad(), at::full({3}, 3.0))) << params[0].grad();
    EXPECT_TRUE(at::allclose(params[1].grad(), at::full({3}, 2.0))) << params[1].grad();
  }
  EXPECT_EQ(r.buckets()[0].params, (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(params[0].grad().is_alias_of(params[1].grad()));
  EXPECT_EQ(comm->count(CollectiveKind::Broadcast), 1);  // rank 0's order, shared once
  EXPECT_EQ(r.reductions(), 2);
}

TEST(Reducer, NoSyncIssuesNoCollectiveAndTheNextSyncedBackwardReducesTheSum) {
  Fixture f;
  auto once = reference_grads(f.params, f.x, 1);
  auto twice = reference_grads(f.params, f.x, 2);
  f.step(/*sync=*/false);
  EXPECT_EQ(f.comm->count(CollectiveKind::AllReduce), 0);
  EXPECT_EQ(f.reducer->reductions(), 0);
  expect_grads(f.params, once);
  f.step(/*sync=*/true);
  EXPECT_EQ(f.comm->count(CollectiveKind::AllReduce), 1);
  EXPECT_EQ(f.reducer->reductions(), 1);
  expect_grads(f.params, twice);
}

TEST(Reducer, ReductionsCountsReducedBackwardPasses) {
  Fixture f;
  auto expected = reference_grads(f.params, f.x);
  for (int i = 1; i <= 3; ++i) {
    for (auto& p : f.params) {
      if (p.grad().defined()) p.grad().zero_();  // optimizer.zero_grad(set_to_none=False)
    }
    f.step();
    EXPECT_EQ(f.reducer->reductions(), i);
    expect_grads(f.params, expected);
  }
  EXPECT_EQ(f.comm->count(CollectiveKind::AllReduce), 3);
}

TEST(Reducer, AGradSetToNoneIsPutBackIntoTheBucket) {
  Fixture f;
  auto expected = reference_grads(f.params, f.x);
  f.step();
  for (auto& p : f.params) p.mutable_grad() = at::Tensor();  // optimizer.zero_grad(set_to_none=True)
  f.step();
  expect_grads(f.params, expected);
  EXPECT_TRUE(f.params[0].grad().is_alias_of(f.params[2].grad()));
  EXPECT_EQ(f.reducer->reductions(), 2);
}

// See Note [Lent bucket views]: autograd accumulates into the view itself, in a synced backward
// and inside no_sync; the pre-hooks go with the reducer.
TEST(Reducer, AGradSetToNoneIsLentItsZeroedViewBeforeAutogradAccumulates) {
  struct Record : torch::autograd::PostAccumulateGradHook {
    std::vector<at::Tensor>* seen;
    explicit Record(std::vector<at::Tensor>* s) : seen(s) {}
    void operator()(const at::Tensor& param) override { seen->push_back(param.grad()); }
  };
  std::vector<at::Tensor> seen;  // what autograd accumulated into, in every backward
  Fixture f;
  torch::autograd::impl::set_post_acc_grad_hooks(f.params[0], std::make_unique<Record>(&seen));
  f.step();
  at::Tensor view = f.params[0].grad();
  for (bool sync : {false, true}) {                            // no_sync, then the reduced backward
    for (auto& p : f.params) p.mutable_grad() = at::Tensor();  // optimizer.zero_grad(set_to_none=True)
    f.step(sync);
  }
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen[1].is_same(view) && seen[2].is_same(view));  // never a fresh tensor after the first
  expect_grads(f.params, reference_grads(f.params, f.x));
  EXPECT_TRUE(f.params[0].grad().is_alias_of(f.params[2].grad()));

  auto accumulator = torch::autograd::impl::grad_accumulator(f.params[0]);
  EXPECT_EQ(accumulator->pre_hooks().size(), 1u);
  f.reducer.reset();
  EXPECT_TRUE(accumulator->pre_hooks().empty());
}

TEST(Reducer, AParameterWithoutGradientIsNamedByTheNextPrepare) {
  std::vector<at::Tensor> params{at::randn({3}).requires_grad_(), at::randn({3}).requires_grad_()};
  auto comm = std::make_shared<OneRankCommunicator>();
  Reducer r(params, {"head.used", "head.unused"}, comm, {});
  r.prepare_for_backward(true);
  (params[0] * 2).sum().backward();
  EXPECT_EQ(comm->count(CollectiveKind::AllReduce), 0);  // its bucket never completed
  EXPECT_EQ(r.reductions(), 0);
  std::string m = error_of<ConfigError>([&] { r.prepare_for_backward(true); });
  expect_contains(m, {"Expected to have finished reduction in the prior iteration", "on rank 0",
                      "Parameter indices which did not receive grad for rank 0: 1.",
                      "Parameters which did not receive grad for rank 0: head.unused. dtcore names them whatever",
                      "set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL",
                      "find_unused_parameters=True", "Fix:"});
  EXPECT_EQ(m.find("head.used"), std::string::npos) << m;
  EXPECT_NO_THROW(r.prepare_for_backward(true));  // the error reset it for the next step
}

// See Note [Unused parameters keep None]: with one rank, unused here is unused everywhere.
TEST(Reducer, FindUnusedParametersLeavesAParameterUnusedEverywhereWithoutGradient) {
  std::vector<at::Tensor> params{at::randn({3}).requires_grad_(), at::randn({3}).requires_grad_()};
  Reducer::Options o;
  o.find_unused_parameters = true;
  Reducer r(params, {"head.used", "head.unused"}, std::make_shared<OneRankCommunicator>(), o);
  for (int pass = 1; pass <= 2; ++pass) {
    r.prepare_for_backward(true);
    at::Tensor loss = (params[0] * 2).sum();
    r.find_unused({loss});
    loss.backward();
    EXPECT_EQ(r.reductions(), pass);
  }
  EXPECT_TRUE(at::equal(params[0].grad(), at::full({3}, 4.0)));  // two passes accumulated
  EXPECT_FALSE(params[1].grad().defined());
  params[1].mutable_grad() = at::ones({3});  // a gradient it had before stays as it is (reduced with it)
  r.prepare_for_backward(true);
  at::Tensor loss = (params[0] * 2).sum();
  r.find_unused({loss});
  loss.backward();
  EXPECT_TRUE(at::equal(params[1].grad(), at::ones({3})));
}

TEST(Reducer, CommDtypeSendsBucketsInThatDtypeAndCopiesBack) {
  Reducer::Options o;
  o.comm_dtype = at::kBFloat16;
  Fixture f(o);
  auto expected = reference_grads(f.params, f.x);
  f.step();
  ASSERT_EQ(f.comm->reduced().size(), 1u);
  EXPECT_EQ(f.comm->reduced()[0].scalar_type(), at::kBFloat16);
  for (auto& g : expected) g = g.to(at::kBFloat16).to(at::kFloat);  // what survives the trip
  expect_grads(f.params, expected);
  EXPECT_EQ(f.params[0].grad().scalar_type(), at::kFloat);
}

TEST(Reducer, BadOptionsAndParametersAreConfigErrorsNamingThem) {
  auto comm = std::make_shared<OneRankCommunicator>();
  auto make = [&](Reducer::Options o, std::vector<at::Tensor> params, std::vector<std::string> names) {
    return error_of<ConfigError>([&] { Reducer(params, names, comm, o); });
  };
  std::vector<at::Tensor> one{at::zeros({2}).requires_grad_()};
  Reducer::Options o;
  o.bucket_mb = 0;
  expect_contains(make(o, one, {"w"}), {"bucket_mb=0"});
  o = {};
  o.first_bucket_mb = -1;
  expect_contains(make(o, one, {"w"}), {"first_bucket_mb=-1"});
  o = {};
  o.comm_dtype = at::kChar;
  expect_contains(make(o, one, {"w"}), {"comm_dtype=torch.int8 cannot carry gradients", "torch.bfloat16", "Fix:"});
  expect_contains(make({}, one, {"w", "extra"}), {"1 parameters but 2 names"});
  at::Tensor leaf = at::zeros({2}).requires_grad_();
  expect_contains(make({}, {leaf * 2}, {"layer.scaled"}), {"parameter 'layer.scaled' is not a leaf tensor", "Fix:"});
  at::Tensor sparse = at::zeros({2}).to_sparse().requires_grad_();
  expect_contains(make({}, {sparse}, {"emb.weight"}), {"parameter 'emb.weight' is not a dense tensor"});
}

TEST(Reducer, FrozenParametersAreLeftOut) {
  std::vector<at::Tensor> params{at::zeros({2}).requires_grad_(), at::zeros({5}), at::zeros({3}).requires_grad_()};
  Reducer r(params, {"a", "frozen", "c"}, std::make_shared<OneRankCommunicator>(), {});
  ASSERT_EQ(r.buckets().size(), 1u);
  EXPECT_EQ(r.buckets()[0].numel, 5);  // 2 + 3
  EXPECT_FALSE(params[1].grad().defined());
}

TEST(Reducer, ReleasedParametersAreTakenOverByANewReducer) {  // Note [One reducer per parameter]
  Fixture f;
  auto expected = reference_grads(f.params, f.x);
  f.step();
  auto make_second = [&] { return std::make_unique<Reducer>(f.params, kNames, f.comm, Reducer::Options{}); };
  expect_contains(error_of<ConfigError>(make_second), {"already carries another reducer's gradient hook"});
  f.reducer->release_parameters();
  auto second = make_second();
  for (auto& p : f.params) p.grad().zero_();
  second->prepare_for_backward(true);
  loss_of(f.params, f.x).backward();  // only the second reducer's hooks run
  expect_grads(f.params, expected);
  EXPECT_EQ(second->reductions(), 1);
  EXPECT_EQ(f.reducer->reductions(), 1);
  EXPECT_EQ(f.comm->count(CollectiveKind::AllReduce), 2);
}

TEST(Reducer, TheLastSyncedBackwardsTimelineAndReadyOrder) {  // Note [Backward timeline]
  Fixture f(two_buckets());
  auto times = f.reducer->last_backward_times();
  EXPECT_EQ(times.comm_start_ns + times.compute_end_ns + times.comm_end_ns, 0);
  EXPECT_TRUE(f.reducer->last_ready_order().empty());
  const auto before =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  f.step();
  times = f.reducer->last_backward_times();
  EXPECT_LE(before, times.comm_start_ns);
  EXPECT_LE(times.comm_start_ns, times.compute_end_ns);
  EXPECT_LE(times.compute_end_ns, times.comm_end_ns);
  auto order = f.reducer->last_ready_order();
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2}));
  f.step(/*sync=*/false);  // a no_sync backward leaves the last synced one's
  EXPECT_EQ(f.reducer->last_backward_times().comm_end_ns, times.comm_end_ns);
  EXPECT_EQ(f.reducer->last_ready_order().size(), 3u);
}

// ZeRO at world size 1: the shard is the whole (padded) bucket, so the reducer's own logic is what is tested.

// Every bucket's gradient shard laid out as the plan says, compared with plain autograd's gradients.
void expect_grad_shards(const Reducer& r, const std::vector<at::Tensor>& expected) {
  const std::vector<at::Tensor> shards = r.grad_shards();
  ASSERT_EQ(shards.size(), r.buckets().size());
  for (size_t b = 0; b < r.buckets().size(); ++b) {
    const Bucket& bucket = r.buckets()[b];
    const at::Tensor& shard = shards[b];
    ASSERT_EQ(shard.numel(), r.shards()[b].shard_numel);
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      at::Tensor got = shard.narrow(0, bucket.offsets[k], bucket.numels[k]);
      EXPECT_TRUE(at::allclose(got, expected[bucket.params[k]].flatten(), 1e-5, 1e-6)) << kNames[bucket.params[k]];
    }
  }
}

TEST(ReducerZero, Zero1KeepsWholeGradientsAndShowsTheShard) {
  Reducer::Options o = tiny_buckets();
  o.zero = 1;
  Fixture f(o);
  auto expected = reference_grads(f.params, f.x, 2);
  f.step();
  f.step();
  expect_grads(f.params, expected);
  expect_grad_shards(*f.reducer, expected);
  EXPECT_TRUE(f.reducer->plan_final());
  f.reducer->zero_grad();
  for (const auto& p : f.params) EXPECT_EQ(p.grad().abs().sum().item<float>(), 0.0f);
}

TEST(ReducerZero, Zero2ReleasesGradientsAndKeepsTheReducedShard) {
  Reducer::Options o = tiny_buckets();
  o.zero = 2;
  Fixture f(o);
  auto one = reference_grads(f.params, f.x, 1);
  f.step();  // the first backward allreduces and is cut to the shard once the plan is final
  for (const auto& p : f.params) EXPECT_FALSE(p.grad().defined());
  expect_grad_shards(*f.reducer, one);
  f.step();  // reduce-scattered, added into the shard as .grad would accumulate
  EXPECT_GT(f.comm->count(CollectiveKind::ReduceScatter), 0);
  for (const auto& p : f.params) EXPECT_FALSE(p.grad().defined());
  expect_grad_shards(*f.reducer, reference_grads(f.params, f.x, 2));
  f.reducer->zero_grad();
  f.step();
  expect_grad_shards(*f.reducer, one);
}

TEST(ReducerZero, Zero2ReducesWhatNoSyncAccumulated) {
  Reducer::Options o = tiny_buckets();
  o.zero = 2;
  Fixture f(o);
  f.step();
  f.reducer->zero_grad();
  f.step(/*sync=*/false);  // local: .grad is autograd's, whole
  for (const auto& p : f.params) EXPECT_TRUE(p.grad().defined());
  f.step();
  for (const auto& p : f.params) EXPECT_FALSE(p.grad().defined());
  expect_grad_shards(*f.reducer, reference_grads(f.params, f.x, 2));
}

// Reduce-scatters finish only when waited for; records, at each start, how many earlier ones are unfinished.
class WaitedCommunicator : public OneRankCommunicator {
 public:
  std::vector<int> unfinished_at_start;

 protected:
  std::shared_ptr<Work> start(const Collective& c) override {
    auto done = OneRankCommunicator::start(c);
    if (c.kind != CollectiveKind::ReduceScatter) return done;
    int unfinished = 0;
    for (const auto& w : issued_) unfinished += !w->is_completed();
    unfinished_at_start.push_back(unfinished);
    issued_.push_back(std::make_shared<OnWait>(timeout()));
    return issued_.back();
  }

 private:
  struct OnWait : Work {
    using Work::Work;
    bool waited = false;
    void wait_for(std::chrono::milliseconds) override { waited = true; }
    bool is_completed() override { return waited; }
  };
  std::vector<std::shared_ptr<OnWait>> issued_;
};

TEST(ReducerZero, Zero2HoldsOneBucketAtATimeDuringBackward) {  // Note [Buckets in flight]
  Reducer::Options o;
  o.zero = 2;
  o.first_bucket_mb = o.bucket_mb = 16.0 / (1 << 20);  // 16 bytes: a bucket per parameter
  auto params = make_params();
  auto comm = std::make_shared<WaitedCommunicator>();
  Reducer r(params, kNames, comm, o);
  at::Tensor x = at::randn({5, 3});
  for (int i = 0; i < 3; ++i) {
    r.prepare_for_backward(true);
    loss_of(params, x).backward();
    r.zero_grad();
  }
  ASSERT_EQ(r.buckets().size(), 3u);
  ASSERT_EQ(comm->unfinished_at_start.size(), 6u);  // two sharded backward passes of 3 buckets
  // A bucket's buffer is allocated only once the previous bucket's reduce-scatter is done.
  EXPECT_EQ(*std::max_element(comm->unfinished_at_start.begin(), comm->unfinished_at_start.end()), 0);
  r.prepare_for_backward(true);
  loss_of(params, x).backward();
  expect_grad_shards(r, reference_grads(params, x, 1));
}

// See Note [Unused parameters keep None]: the parameters ShardedOptimizer skips, as torch's optimizer
// skips a .grad that torch DDP left None.
TEST(ReducerZero, ParamsWithoutGradAreTheOnesNoBackwardReachedSinceZeroGradSetToNone) {
  std::vector<at::Tensor> params{at::randn({3}).requires_grad_(), at::randn({3}).requires_grad_(),
                                 at::randn({3}).requires_grad_()};
  Reducer::Options o;
  o.zero = 2;
  o.find_unused_parameters = true;
  Reducer r(params, {"used", "local", "unused"}, std::make_shared<OneRankCommunicator>(), o);
  using Indices = std::vector<size_t>;
  EXPECT_EQ(r.params_without_grad(), (Indices{0, 1, 2}));  // before training, as .grad is None
  auto pass = [&](bool sync, bool use_local) {
    r.prepare_for_backward(sync);
    at::Tensor loss = (params[0] * 2).sum();
    if (use_local) loss = loss + params[1].sum();
    r.find_unused({loss});
    loss.backward();
  };
  for (int i = 0; i < 3; ++i) {  // allreduced, then reduce-scattered once the plan is final
    pass(true, false);
    EXPECT_EQ(r.params_without_grad(), (Indices{1, 2}));
    r.zero_grad();
  }
  pass(false, true);  // used inside no_sync only: a gradient all the same, as torch DDP's used map says
  pass(true, false);
  EXPECT_EQ(r.params_without_grad(), (Indices{2}));
  r.zero_grad(/*set_to_none=*/false);  // zeros are a gradient: stepped, as torch's optimizer would
  EXPECT_TRUE(r.params_without_grad().empty());
  r.zero_grad();
  EXPECT_EQ(r.params_without_grad(), (Indices{0, 1, 2}));
}

TEST(ReducerZero, PadsBucketsToEqualShards) {
  Reducer::Options o;
  o.zero = 1;
  Fixture f(o);
  for (const BucketShard& s : f.reducer->shards()) EXPECT_EQ(s.padded_numel, s.shard_numel);  // world 1
}

TEST(ReducerZero, RefusesAStageItDoesNotOffer) {
  Reducer::Options o;
  o.zero = 3;
  expect_contains(error_of<ConfigError>([&] { Fixture f(o); }), {"zero=3", "Fix: pass zero=0"});
  Fixture plain;
  expect_contains(error_of<ConfigError>([&] { plain.reducer->grad_shards(); }), {"zero=0", "zero=1"});
}
