// Bucket planning: order, caps, grouping, layout. See Note [Bucket layout].
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>
#include <set>

#include "dtcore/common/error.h"
#include "dtcore/reducer/bucket_plan.h"

using namespace dtcore;

namespace {
GradSpec f32(int64_t numel) { return GradSpec{numel, c10::ScalarType::Float, c10::Device(c10::DeviceType::CPU)}; }
GradSpec bf16(int64_t numel) { return GradSpec{numel, c10::ScalarType::BFloat16, c10::Device(c10::DeviceType::CPU)}; }

// Every gradient exactly once, offsets back to back.
void expect_valid_layout(const std::vector<Bucket>& buckets, size_t n) {
  std::set<size_t> all;
  for (const auto& b : buckets) {
    ASSERT_EQ(b.params.size(), b.offsets.size());
    int64_t next = 0;
    for (size_t i = 0; i < b.params.size(); ++i) {
      EXPECT_EQ(b.offsets[i], next);
      next += b.numels[i];
      EXPECT_TRUE(all.insert(b.params[i]).second) << "gradient " << b.params[i] << " placed twice";
    }
    EXPECT_EQ(b.numel, next);
  }
  EXPECT_EQ(all.size(), n);
}
}  // namespace

TEST(BucketPlan, ReverseRegistrationOrderFillsTheSmallFirstBucketThenTheBigOnes) {
  // 8 gradients of 1 KiB each (256 floats); first cap 2 KiB, cap 4 KiB.
  std::vector<GradSpec> grads(8, f32(256));
  auto buckets = plan_buckets(grads, reverse_registration_order(8), BucketCaps{4096, 2048});
  expect_valid_layout(buckets, 8);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{7, 6}));        // first bucket: 2 KiB
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{5, 4, 3, 2}));  // then 4 KiB each
  EXPECT_EQ(buckets[2].params, (std::vector<size_t>{1, 0}));        // the rest
  EXPECT_EQ(buckets[1].bytes(), 4096);
}

TEST(BucketPlan, AGradientLargerThanTheCapClosesItsBucketAndIsNeverSplit) {
  std::vector<GradSpec> grads{f32(10), f32(100000), f32(10)};
  auto buckets = plan_buckets(grads, reverse_registration_order(3), BucketCaps{1024, 64});
  expect_valid_layout(buckets, 3);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{2, 1}));  // 40 B, then the 400 KB one closes it
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{0}));
}

TEST(BucketPlan, TinyCapsGiveOneGradientPerBucket) {
  std::vector<GradSpec> grads{f32(3), f32(5), f32(7)};
  auto buckets = plan_buckets(grads, reverse_registration_order(3), BucketCaps{1, 1});
  ASSERT_EQ(buckets.size(), 3u);
  for (const auto& b : buckets) EXPECT_EQ(b.params.size(), 1u);
}

TEST(BucketPlan, BucketsHoldOneDtypeEachAndEachKindHasItsOwnFirstBucket) {
  std::vector<GradSpec> grads{f32(256), bf16(512), f32(256), bf16(512)};
  auto buckets = plan_buckets(grads, reverse_registration_order(4), BucketCaps{1 << 20, 1024});
  expect_valid_layout(buckets, 4);
  ASSERT_EQ(buckets.size(), 4u);  // each kind: a 1 KiB first bucket, then the rest
  for (const auto& b : buckets) {
    for (size_t p : b.params) EXPECT_EQ(grads[p].dtype, b.dtype);
  }
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{3}));  // bf16, ready first
  EXPECT_EQ(buckets[0].dtype, c10::ScalarType::BFloat16);
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{2}));  // f32
}

TEST(BucketPlan, RebuildFollowsTheObservedReadyOrder) {
  std::vector<GradSpec> grads(4, f32(256));
  std::vector<size_t> observed{1, 3, 0, 2};  // e.g. a model whose forward order differs from registration
  auto buckets = plan_buckets(grads, observed, BucketCaps{2048, 1024});
  expect_valid_layout(buckets, 4);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{1}));
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{3, 0}));
  EXPECT_EQ(buckets[2].params, (std::vector<size_t>{2}));
}

TEST(BucketPlan, BadInputs) {
  std::vector<GradSpec> grads(3, f32(1));
  EXPECT_THROW(plan_buckets(grads, {0, 1}, BucketCaps{}), std::invalid_argument);
  EXPECT_THROW(plan_buckets(grads, {0, 1, 1}, BucketCaps{}), std::invalid_argument);
  EXPECT_THROW(plan_buckets(grads, {0, 1, 3}, BucketCaps{}), std::invalid_argument);
  EXPECT_THROW(plan_buckets(grads, {0, 1, 2}, BucketCaps{0, 1}), ConfigError);
  EXPECT_TRUE(plan_buckets({}, {}, BucketCaps{}).empty());
  EXPECT_EQ(mebibytes_to_bytes(25.0, "bucket_mb"), 25 << 20);
  EXPECT_EQ(mebibytes_to_bytes(0.001, "bucket_mb"), 1049);
  try {
    mebibytes_to_bytes(-1, "bucket_mb");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bucket_mb=-1 is not a positive size"), std::string::npos) << e.what();
  }
}

// --- bucket_mb="auto": See Note [Buckets that size themselves] ---

namespace {
constexpr int64_t kMiB = 1 << 20;
std::vector<size_t> in_order(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  return order;
}
std::vector<Bucket> plan_of(const std::vector<GradSpec>& grads, const std::vector<std::vector<size_t>>& groups) {
  std::vector<Bucket> plan;
  for (const auto& members : groups) plan.push_back(bucket_of(grads, members));
  return plan;
}
}  // namespace

TEST(AutoBucketPlan, GradientsThatComeInOneBurstShareOneBucket) {
  std::vector<GradSpec> grads(6, f32(kMiB / 4));  // 1 MiB each
  const CollectiveCost cost{50e3, 1e-3};          // 50 us + 1 ms/MiB
  auto plan = plan_buckets_auto(grads, in_order(6), std::vector<int64_t>(6, 0), cost);
  expect_valid_layout(plan, 6);
  ASSERT_EQ(plan.size(), 1u);  // nothing can overlap: each extra collective only adds its fixed cost
}

TEST(AutoBucketPlan, ASpreadBackwardGetsBucketsThatHideItsCommunication) {
  // 8 gradients of 1 MiB, one every 2 ms; an all-reduce costs 0.1 ms + 1 ms/MiB: buckets of a
  // gradient or two keep up with the backward, one bucket of 8 MiB leaves 8.1 ms exposed.
  std::vector<GradSpec> grads(8, f32(kMiB / 4));
  std::vector<int64_t> ready(8);
  for (size_t i = 0; i < 8; ++i) ready[i] = static_cast<int64_t>(i) * 2'000'000;
  const CollectiveCost cost{100e3, 1e6 / kMiB};  // 1 ms per MiB
  auto plan = plan_buckets_auto(grads, in_order(8), ready, cost);
  expect_valid_layout(plan, 8);
  EXPECT_GE(plan.size(), 3u);
  const double mine = exposed_ns(plan, in_order(8), ready, grads, cost);
  const double one = exposed_ns(plan_of(grads, {{0, 1, 2, 3, 4, 5, 6, 7}}), in_order(8), ready, grads, cost);
  const double each =
      exposed_ns(plan_of(grads, {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}), in_order(8), ready, grads, cost);
  EXPECT_NEAR(one, cost.ns(8 * kMiB), 1.0);
  EXPECT_LT(mine, cost.ns(2 * kMiB));  // about the last gradient's own collective, plus the delays
  EXPECT_LE(mine, each);               // a collective per gradient pays 7 delays
  EXPECT_LT(plan.back().params.size(), 3u);
  // In completion order, each bucket's gradients consecutive in the observed order.
  size_t next = 0;
  for (const Bucket& b : plan) {
    for (size_t i : b.params) EXPECT_EQ(i, next++);
  }
}

TEST(AutoBucketPlan, ACheapCollectiveOnALongBackwardNeedsFewBuckets) {
  // 50 gradients of 64 KiB over 500 ms; an all-reduce costs 250 us + 60 us/MiB (Gloo through shared
  // memory): a bucket per gradient would delay the backward by 12 ms to save under 1 ms.
  std::vector<GradSpec> grads(50, f32(16384));
  std::vector<int64_t> ready(50);
  for (size_t i = 0; i < 50; ++i) ready[i] = static_cast<int64_t>(i) * 10'000'000;
  const CollectiveCost cost{250e3, 60e3 / kMiB};
  auto plan = plan_buckets_auto(grads, in_order(50), ready, cost);
  expect_valid_layout(plan, 50);
  EXPECT_LE(plan.size(), 2u);
}

TEST(AutoBucketPlan, IsTheBestOfEveryCutOfTheOrder) {
  // Against all 2^(m-1) ways to cut m gradients, on random sizes, times and costs.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const size_t m = 2 + rng() % 8;
    std::vector<GradSpec> grads;
    std::vector<int64_t> ready(m);
    int64_t t = 0;
    for (size_t i = 0; i < m; ++i) {
      grads.push_back(f32(1 + static_cast<int64_t>(rng() % 300000)));
      t += static_cast<int64_t>(rng() % 3'000'000);
      ready[i] = t;
    }
    std::vector<size_t> order = in_order(m);
    std::shuffle(order.begin(), order.end(), rng);  // any observed order
    const CollectiveCost cost{static_cast<double>(rng() % 500'000), (rng() % 1000) / 1000.0};
    auto plan = plan_buckets_auto(grads, order, ready, cost);
    expect_valid_layout(plan, m);
    const double mine = exposed_ns(plan, order, ready, grads, cost);
    double best = std::numeric_limits<double>::infinity();
    for (uint32_t cuts = 0; cuts < (1u << (m - 1)); ++cuts) {
      std::vector<std::vector<size_t>> groups{{order[0]}};
      for (size_t k = 1; k < m; ++k) {
        if (cuts & (1u << (k - 1))) groups.emplace_back();
        groups.back().push_back(order[k]);
      }
      best = std::min(best, exposed_ns(plan_of(grads, groups), order, ready, grads, cost));
    }
    EXPECT_NEAR(mine, best, 1e-3 * std::max(1.0, best)) << "trial " << trial;
  }
}

TEST(AutoBucketPlan, FreeCommunicationKeepsOneBucketAndDtypesApart) {
  std::vector<GradSpec> grads{f32(100), bf16(100), f32(100), bf16(100)};
  std::vector<int64_t> ready{0, 1000, 2000, 3000};
  auto plan = plan_buckets_auto(grads, in_order(4), ready, CollectiveCost{0, 0});
  expect_valid_layout(plan, 4);
  ASSERT_EQ(plan.size(), 2u);                              // one per dtype: ties go to fewer buckets
  EXPECT_EQ(plan[0].params, (std::vector<size_t>{0, 2}));  // completes first (its last gradient at 2000)
  EXPECT_EQ(plan[1].params, (std::vector<size_t>{1, 3}));
  EXPECT_EQ(plan[1].dtype, c10::ScalarType::BFloat16);
}

TEST(AutoBucketPlan, RefusesTimesThatGoBackwards) {
  std::vector<GradSpec> grads(3, f32(10));
  EXPECT_THROW(plan_buckets_auto(grads, in_order(3), {0, 5, 4}, CollectiveCost{}), std::invalid_argument);
  EXPECT_THROW(plan_buckets_auto(grads, in_order(3), {0, 5}, CollectiveCost{}), std::invalid_argument);
}

TEST(AutoBucketPlan, ThousandsOfGradientsArePlannedInRunsQuickly) {
  // A model of 20000 tensors (an MoE's experts): cuts go between runs of about 1/512 of the bytes.
  std::vector<GradSpec> grads(20000, f32(1000));
  std::vector<int64_t> ready(grads.size());
  for (size_t i = 0; i < ready.size(); ++i) ready[i] = static_cast<int64_t>(i) * 50'000;  // 1 s in all
  const auto start = std::chrono::steady_clock::now();
  auto plan = plan_buckets_auto(grads, in_order(grads.size()), ready, CollectiveCost{100e3, 1e6 / kMiB});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_valid_layout(plan, grads.size());
  EXPECT_GT(plan.size(), 1u);
  EXPECT_LE(plan.size(), kMaxAutoBuckets);
  EXPECT_LT(seconds, 5.0);
}
