// Bucket planning: order, caps, grouping, layout. See Note [Bucket layout].
#include <gtest/gtest.h>

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
