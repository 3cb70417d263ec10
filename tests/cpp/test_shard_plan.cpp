// Shard planning: equal shards, padding, pieces that cover every parameter exactly once across
// ranks. See Note [Shard layout].
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include "dtcore/reducer/shard_plan.h"

using namespace dtcore;

namespace {

Bucket bucket_of(std::vector<int64_t> numels) {
  Bucket b;
  for (size_t i = 0; i < numels.size(); ++i) {
    b.params.push_back(10 + i);
    b.offsets.push_back(b.numel);
    b.numels.push_back(numels[i]);
    b.numel += numels[i];
  }
  return b;
}

}  // namespace

TEST(ShardPlan, PadsToAMultipleOfTheWorld) {
  EXPECT_EQ(padded_numel(10, 4), 12);
  EXPECT_EQ(padded_numel(12, 4), 12);
  EXPECT_EQ(padded_numel(1, 3), 3);
  EXPECT_EQ(padded_numel(0, 2), 2);  // never an empty shard
  EXPECT_EQ(padded_numel(7, 1), 7);
}

TEST(ShardPlan, EveryElementOfEveryParameterIsOwnedByExactlyOneRank) {
  for (int world : {1, 2, 3, 4, 7}) {
    Bucket b = bucket_of({5, 1, 12, 3, 9});     // 30 elements
    std::map<size_t, std::vector<int>> owners;  // param -> owner count per element
    for (size_t k = 0; k < b.params.size(); ++k) owners[b.params[k]].assign(b.numels[k], 0);
    int64_t shard = -1;
    for (int r = 0; r < world; ++r) {
      BucketShard s = shard_bucket(b, world, r);
      EXPECT_EQ(s.padded_numel % world, 0);
      EXPECT_GE(s.padded_numel, b.numel);
      EXPECT_LT(s.padded_numel - b.numel, world);
      if (shard >= 0) EXPECT_EQ(s.shard_numel, shard) << "shards must be equal";
      shard = s.shard_numel;
      EXPECT_EQ(s.begin, r * s.shard_numel);
      int64_t last = -1;
      for (const ShardPiece& p : s.pieces) {
        EXPECT_GT(p.numel, 0);
        EXPECT_GE(p.shard_offset, 0);
        EXPECT_LE(p.shard_offset + p.numel, s.shard_numel);
        EXPECT_GT(p.shard_offset, last) << "pieces in layout order";
        last = p.shard_offset;
        for (int64_t e = 0; e < p.numel; ++e) owners.at(p.param).at(p.param_offset + e) += 1;
      }
    }
    for (const auto& [param, counts] : owners) {
      for (size_t e = 0; e < counts.size(); ++e) {
        EXPECT_EQ(counts[e], 1) << "world " << world << ", parameter " << param << ", element " << e;
      }
    }
  }
}

TEST(ShardPlan, SplitsAParameterThatCrossesAShardBoundary) {
  Bucket b = bucket_of({3, 5});  // 8 elements, 2 ranks: [0, 4) and [4, 8)
  BucketShard r0 = shard_bucket(b, 2, 0);
  ASSERT_EQ(r0.pieces.size(), 2u);
  EXPECT_EQ(r0.pieces[1].param, 11u);
  EXPECT_EQ(r0.pieces[1].param_offset, 0);
  EXPECT_EQ(r0.pieces[1].shard_offset, 3);
  EXPECT_EQ(r0.pieces[1].numel, 1);
  BucketShard r1 = shard_bucket(b, 2, 1);
  ASSERT_EQ(r1.pieces.size(), 1u);
  EXPECT_EQ(r1.pieces[0].param, 11u);
  EXPECT_EQ(r1.pieces[0].param_offset, 1);
  EXPECT_EQ(r1.pieces[0].shard_offset, 0);
  EXPECT_EQ(r1.pieces[0].numel, 4);
}

TEST(ShardPlan, ARankMayHoldOnlyPadding) {
  Bucket b = bucket_of({2});  // 4 ranks: padded to 4, ranks 2 and 3 hold padding only
  EXPECT_EQ(shard_bucket(b, 4, 1).pieces.size(), 1u);
  EXPECT_TRUE(shard_bucket(b, 4, 2).pieces.empty());
  EXPECT_TRUE(shard_bucket(b, 4, 3).pieces.empty());
}

TEST(ShardPlan, RefusesARankOutsideTheWorld) {
  Bucket b = bucket_of({4});
  EXPECT_THROW(shard_bucket(b, 2, 2), std::invalid_argument);
  EXPECT_THROW(shard_bucket(b, 2, -1), std::invalid_argument);
}
