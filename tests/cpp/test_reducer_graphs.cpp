// Graphs that vary, on the Reducer at world size 1: a hook with an undefined gradient readies its parameter
// without using it (Note [Outputs the loss does not use]); a static graph records its unused parameters and
// refuses a change (Note [Static graph]); a bucket no rank used is skipped and reduced late once used (Note
// [Skipped buckets]); a changing graph keeps torch's first plan (Note [The first plan]).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include "dtcore/common/error.h"
#include "dtcore/reducer/reducer.h"
#include "expect_error.h"
#include "reducer_test_util.h"

using namespace dtcore;
using namespace dtcore::testing;

namespace {

Reducer::Options find_unused(Reducer::Options o = tiny_buckets()) {
  o.find_unused_parameters = true;
  return o;
}

// A loss of params[i] for each i in `used`; the graph search sees exactly those.
at::Tensor loss_of(Reducer& r, const std::vector<at::Tensor>& params, const std::vector<size_t>& used) {
  at::Tensor loss = at::zeros({});
  for (size_t i : used) loss = loss + (params[i] * 2).sum();
  r.find_unused({loss});
  return loss;
}

std::vector<at::Tensor> kib_params(int n) {  // 1 KiB each: one per bucket with tiny_buckets()
  std::vector<at::Tensor> params;
  for (int i = 0; i < n; ++i) params.push_back(at::ones({256}).requires_grad_());
  return params;
}

}  // namespace

TEST(ReducerGraphs, AnUndefinedGradientReadiesItsParameterAndLeavesItNone) {
  auto params = kib_params(2);
  Reducer r(params, {"used", "ignored"}, std::make_shared<OneRankCommunicator>(), find_unused());
  r.prepare_for_backward(true);
  at::Tensor used = (params[0] * 2).sum();
  // What an output the loss ignores gives its parameters, through the wrapper's output function.
  at::Tensor ignored = torch::autograd::UndefinedGrad().apply({(params[1] * 3).sum()})[0];
  r.find_unused({used, ignored});
  (used + ignored).backward();
  EXPECT_EQ(r.reductions(), 1);  // every bucket started: the hook came, with nothing in it
  EXPECT_TRUE(params[0].grad().defined());
  EXPECT_FALSE(params[1].grad().defined());  // unused everywhere: None, not zeros
}

TEST(ReducerGraphs, AStaticGraphRecordsItsUnusedParametersAndRefusesAChange) {
  auto params = kib_params(2);
  Reducer::Options o = tiny_buckets();
  o.static_graph = true;
  Reducer r(params, {"lin1", "lin2"}, std::make_shared<OneRankCommunicator>(), o);
  EXPECT_TRUE(r.find_unused_parameters());  // the first backward searches the graph
  r.prepare_for_backward(true);
  loss_of(r, params, {0}).backward();
  EXPECT_TRUE(r.static_graph_recorded());
  EXPECT_FALSE(params[1].grad().defined());

  r.prepare_for_backward(true);
  r.find_unused({});  // no search: the record says lin2 is unused
  loss_of(r, params, {0}).backward();
  EXPECT_EQ(r.reductions(), 2);

  r.prepare_for_backward(true);
  at::Tensor changed = loss_of(r, params, {0, 1});
  std::string m = error_of<ConfigError>([&] { changed.backward(); });
  expect_contains(m, {"Your training graph has changed in this iteration", "Parameter 'lin2' (index 1)", "Fix:"});
  EXPECT_EQ(r.last_backward_error().count, 1);
  EXPECT_EQ(r.last_backward_error().kind, "ConfigError");
  m = error_of<ConfigError>([&] { r.prepare_for_backward(true); });
  expect_contains(m, {"this is not compatible with static_graph set to True.\nParameter indices which did not "
                      "receive grad for rank 0: 0.",
                      "Parameters which did not receive grad for rank 0: lin1."});
  r.prepare_for_backward(true);  // drained: the recorded graph trains again
  loss_of(r, params, {0}).backward();
  EXPECT_EQ(r.reductions(), 3);
  error_of<ConfigError>([&] { r.set_static_graph(); });  // only before training
}

TEST(ReducerGraphs, ABucketNoRankUsedIsSkippedAndReducedLateOnceUsed) {
  auto params = kib_params(2);
  Reducer::Options o = find_unused();
  o.skip_all_reduce_unused_params = true;
  auto comm = std::make_shared<OneRankCommunicator>();
  Reducer r(params, {"used", "spare"}, comm, o);
  ASSERT_EQ(r.buckets().size(), 2u);
  auto step = [&](std::vector<size_t> used) {
    const int before = comm->count(CollectiveKind::AllReduce);
    r.prepare_for_backward(true);
    loss_of(r, params, used).backward();
    return comm->count(CollectiveKind::AllReduce) - before;  // buckets and the used map
  };
  EXPECT_EQ(step({0}), 3);  // nothing is known yet: both buckets
  EXPECT_EQ(r.last_buckets_reduced(), 2);
  EXPECT_EQ(step({0}), 2);  // spare's bucket skipped
  EXPECT_EQ(r.last_buckets_reduced(), 1);
  EXPECT_FALSE(params[1].grad().defined());
  EXPECT_EQ(step({0, 1}), 3);  // used after all: reduced at the end of backward
  EXPECT_EQ(r.last_buckets_reduced(), 2);
  EXPECT_TRUE(at::equal(params[1].grad(), at::full({256}, 2.0)));
  error_of<ConfigError>([&] {
    Reducer::Options bad = tiny_buckets();
    bad.skip_all_reduce_unused_params = true;
    Reducer(kib_params(1), {"a"}, comm, bad);
  });
}

TEST(ReducerGraphs, AChangingGraphKeepsTorchsFirstPlan) {
  std::vector<at::Tensor> params{at::zeros({600}).requires_grad_(), at::zeros({10}).requires_grad_()};
  Reducer::Options o;  // caps of 2 KiB: the first parameter fills one alone
  o.bucket_mb = o.first_bucket_mb = 2.0 / 1024;
  Reducer dynamic(params, {"big", "small"}, std::make_shared<OneRankCommunicator>(), find_unused(o));
  ASSERT_EQ(dynamic.buckets().size(), 2u);  // filled in registration order, reduced in reverse
  EXPECT_EQ(dynamic.buckets()[0].params, (std::vector<size_t>{1}));
  EXPECT_EQ(dynamic.buckets()[1].params, (std::vector<size_t>{0}));
  dynamic.prepare_for_backward(true);
  loss_of(dynamic, params, {0, 1}).backward();
  EXPECT_FALSE(dynamic.order_rebuilt());
  EXPECT_EQ(dynamic.buckets().size(), 2u);
  dynamic.release_parameters();
  Reducer fixed(params, {"big", "small"}, std::make_shared<OneRankCommunicator>(), o);
  EXPECT_EQ(fixed.buckets().size(), 1u);  // filled in reverse registration order: small, then big
  fixed.prepare_for_backward(true);
  (params[0].sum() + params[1].sum()).backward();
  EXPECT_TRUE(fixed.order_rebuilt());
}
