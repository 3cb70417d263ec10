// Checkpoint planning: the peak model, known optima, ties, infeasible budgets, and a brute-force
// cross-check. See Note [Checkpoint peak model].
#include <gtest/gtest.h>

#include <random>

#include "dtcore/activation/plan.h"
#include "dtcore/common/error.h"

using namespace dtcore;
using namespace dtcore::activation;

namespace {
constexpr Mode K = Mode::kKeep, F = Mode::kFull, S = Mode::kSelective;

BlockProfile block(int64_t act, int64_t in, double seconds, std::string name = "b") {
  return BlockProfile{std::move(name), act, in, seconds};
}

// The plan for `budget` is feasible, with these modes, this peak and this recompute time.
void expect_plan(const std::vector<BlockProfile>& b, int64_t fixed, int64_t budget, const std::vector<Mode>& modes,
                 int64_t peak, double seconds) {
  CheckpointPlan p = plan_checkpoints(b, fixed, budget);
  ASSERT_TRUE(p.feasible) << "budget " << budget;
  EXPECT_EQ(p.modes, modes) << "budget " << budget;
  EXPECT_EQ(p.peak_bytes, peak) << "budget " << budget;
  EXPECT_DOUBLE_EQ(p.recompute_seconds, seconds) << "budget " << budget;
}

struct Best {
  bool feasible = false;
  double seconds = 0;
  int64_t min_peak = 0;
};

// Every choice of modes (3^n, or 2^n without selective options): the least recompute time under
// the budget, and the least peak of all.
Best brute_force(const std::vector<BlockProfile>& blocks, int64_t fixed, int64_t budget) {
  Best best;
  best.min_peak = INT64_MAX;
  const size_t n = blocks.size();
  size_t total = 1;
  for (size_t i = 0; i < n; ++i) total *= 3;
  for (size_t code = 0; code < total; ++code) {
    std::vector<Mode> c(n);
    bool ok = true;
    for (size_t i = 0, rest = code; i < n; ++i, rest /= 3) {
      c[i] = static_cast<Mode>(rest % 3);
      ok = ok && (c[i] != S || blocks[i].selective_bytes >= 0);
    }
    if (!ok) continue;
    const double s = recompute_seconds(blocks, c);
    const int64_t peak = predicted_peak(blocks, fixed, c);
    best.min_peak = std::min(best.min_peak, peak);
    if (peak <= budget && (!best.feasible || s < best.seconds)) {
      best.feasible = true;
      best.seconds = s;
    }
  }
  return best;
}
}  // namespace

TEST(ActivationPlan, PeakIsTheEndOfForwardOrTheLargestRecompute) {
  // a = 10 each, x = 1 each, fixed 5.
  std::vector<BlockProfile> b{block(10, 1, 1), block(10, 1, 1), block(10, 1, 1)};
  EXPECT_EQ(predicted_peak(b, 5, {K, K, K}), 35);
  EXPECT_EQ(predicted_peak(b, 5, {F, F, F}), 17);  // recompute of block 2: 5 + 1 + 1 + 10
  EXPECT_EQ(predicted_peak(b, 5, {F, K, K}), 26);  // end of forward: 5 + 1 + 10 + 10
  // Checkpointing the last block: its recompute sees both earlier blocks' activations.
  EXPECT_EQ(predicted_peak(b, 5, {K, K, F}), 35);
  EXPECT_THROW(predicted_peak(b, 5, {F}), std::invalid_argument);
}

TEST(ActivationPlan, ABudgetAboveTheBaselineCheckpointsNothing) {
  std::vector<BlockProfile> b{block(10, 1, 1), block(10, 1, 1)};
  CheckpointPlan p = plan_checkpoints(b, 0, 20);
  ASSERT_TRUE(p.feasible);
  EXPECT_EQ(p.modes, (std::vector<Mode>{K, K}));
  EXPECT_EQ(p.peak_bytes, 20);
  EXPECT_EQ(p.baseline_peak_bytes, 20);
  EXPECT_DOUBLE_EQ(p.recompute_seconds, 0.0);
}

TEST(ActivationPlan, ZeroAndOneBlock) {
  CheckpointPlan none = plan_checkpoints({}, 7, 10);
  EXPECT_TRUE(none.feasible);
  EXPECT_TRUE(none.modes.empty());
  EXPECT_EQ(none.peak_bytes, 7);
  EXPECT_FALSE(plan_checkpoints({}, 11, 10).feasible);

  // One block: checkpointing it cannot lower the peak (its recompute holds it all again).
  CheckpointPlan one = plan_checkpoints({block(100, 10, 1)}, 0, 99);
  EXPECT_FALSE(one.feasible);
  EXPECT_EQ(one.min_peak_bytes, 100);
  EXPECT_TRUE(plan_checkpoints({block(100, 10, 1)}, 0, 100).feasible);
}

TEST(ActivationPlan, TiesInTimeGoToTheLowerPeak) {
  // {a} and {b} cost 1 s each and both fit 45: {a} peaks at 1 + 10 + 30 = 41, {b} at 10 + 3 + 30 = 43.
  std::vector<BlockProfile> b{block(10, 1, 1, "a"), block(10, 3, 1, "b"), block(30, 30, 9, "c")};
  expect_plan(b, 0, 45, {F, K, K}, 41, 1.0);
  // Identical blocks: the earlier one's recompute comes when less is held, so it is preferred.
  expect_plan({block(10, 1, 1), block(10, 1, 1), block(10, 1, 1)}, 0, 21, {F, K, K}, 21, 1.0);
}

TEST(ActivationPlan, TheRecomputeOfALateBlockCanRuleItOut) {
  // Checkpointing the last block alone sheds the most bytes at the end of forward, but its
  // recompute comes when both earlier blocks are still held: 10 + 10 + 10 = 30 > 25.
  expect_plan({block(10, 1, 3, "a"), block(10, 1, 3, "b"), block(10, 1, 1, "c")}, 0, 25, {F, K, K}, 21, 3.0);
}

TEST(ActivationPlan, GreedyByBytesPerSecondIsWrongAndThePlannerIsNot) {
  // Baseline 30, budget 20: at least 10 bytes must go (every x = 0). Greedy by bytes saved per
  // second takes A (6 bytes for 5 s, 1.2/s), then B (1.11/s): 9.5 s. B + C shed 10 for 9.0 s.
  std::vector<BlockProfile> b{block(6, 0, 5, "A"), block(5, 0, 4.5, "B"), block(5, 0, 4.5, "C"),
                              block(14, 14, 100, "D")};
  expect_plan(b, 0, 20, {K, F, F, K}, 20, 9.0);
}

TEST(ActivationPlan, SelectiveBlocksFillTheGapsBetweenWholeBlocks) {
  // Three blocks of 16 held, 1 when fully checkpointed (10 s), 12 when selective (1 s).
  std::vector<BlockProfile> b(3, block(16, 1, 10));
  for (auto& x : b) {
    x.selective_bytes = 12;
    x.selective_seconds = 1;
  }
  EXPECT_EQ(predicted_peak(b, 0, {S, K, K}), 44);  // end of forward: 12 + 16 + 16
  EXPECT_EQ(predicted_peak(b, 0, {K, K, S}), 59);  // recompute of block 2: 16 + 16 + 16 + 12 - 1
  // Budget 44: one selective block (1 s) fits; whole blocks would cost 10 s.
  expect_plan(b, 0, 44, {S, K, K}, 44, 1.0);
  // Budget 33: two selective blocks hold 12 + 12 + 16 = 40, too much; one whole block does it.
  expect_plan(b, 0, 33, {F, K, K}, 33, 10.0);
  // Budget 29: a whole block and a selective one (11 s) rather than two whole blocks (20 s).
  CheckpointPlan r = plan_checkpoints(b, 0, 29);
  ASSERT_TRUE(r.feasible);
  EXPECT_DOUBLE_EQ(r.recompute_seconds, 11.0);
  EXPECT_LE(r.peak_bytes, 29);
  BlockProfile no_selective = block(16, 1, 10);
  EXPECT_THROW(predicted_peak({no_selective}, 0, {S}), ConfigError);
}

TEST(ActivationPlan, AnInfeasibleBudgetReportsTheSmallestAchievablePeak) {
  std::vector<BlockProfile> b{block(10, 1, 1), block(10, 1, 1), block(10, 1, 1)};
  CheckpointPlan p = plan_checkpoints(b, 5, 16);
  EXPECT_FALSE(p.feasible);
  EXPECT_EQ(p.min_peak_bytes, 17);  // all checkpointed: recompute of the last block
  EXPECT_EQ(p.baseline_peak_bytes, 35);
  EXPECT_EQ(p.modes, (std::vector<Mode>(3, K)));
  EXPECT_TRUE(plan_checkpoints(b, 5, 17).feasible);
}

TEST(ActivationPlan, BadInputsAreConfigErrorsNamingTheValue) {
  try {
    plan_checkpoints({block(1, 1, 1)}, 0, 0);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("budget is 0 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_checkpoints({block(-1, 1, 1, "blocks.3")}, 0, 10), ConfigError);
  EXPECT_THROW(plan_checkpoints({block(1, 1, -0.5)}, 0, 10), ConfigError);
  EXPECT_THROW(plan_checkpoints({block(1, 1, 1)}, -1, 10), ConfigError);
}

TEST(ActivationPlan, MatchesBruteForceOnRandomSmallProfiles) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = 1 + rng() % 7;
    std::vector<BlockProfile> b;
    for (size_t i = 0; i < n; ++i) {
      const int64_t act = 1 + rng() % 200;
      const int64_t in = rng() % 4 == 0 ? static_cast<int64_t>(rng() % 250) : static_cast<int64_t>(rng() % (act + 1));
      BlockProfile p = block(act, in, 0.001 * (1 + rng() % 1000));
      if (rng() % 2 == 0) {  // a selective option between the two
        p.selective_bytes = in + static_cast<int64_t>(rng() % (act + 1));
        p.selective_seconds = p.forward_seconds * 0.001 * static_cast<double>(rng() % 1000);
      }
      b.push_back(p);
    }
    const int64_t fixed = rng() % 50;
    const int64_t budget = 1 + rng() % 2000;  // below kPlanStates: no quantisation, exactly optimal
    const Best want = brute_force(b, fixed, budget);
    const CheckpointPlan got = plan_checkpoints(b, fixed, budget);
    ASSERT_EQ(got.feasible, want.feasible) << "trial " << trial;
    EXPECT_EQ(got.min_peak_bytes, want.min_peak) << "trial " << trial;
    if (want.feasible) {
      EXPECT_NEAR(got.recompute_seconds, want.seconds, 1e-9) << "trial " << trial;
      EXPECT_LE(got.peak_bytes, budget);
      EXPECT_EQ(got.peak_bytes, predicted_peak(b, fixed, got.modes));
    }
  }
}

TEST(ActivationPlan, LargeSizesAreQuantisedConservativelyAndHundredsOfBlocksAreFast) {
  std::mt19937 rng(99);
  // GiB-scale sizes: quantised, so the plan is feasible under the exact model and near optimal.
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 1 + rng() % 9;
    std::vector<BlockProfile> b;
    for (size_t i = 0; i < n; ++i) {
      const int64_t act = (1 + rng() % 1000) * 1'000'003LL;
      b.push_back(block(act, act / (2 + rng() % 30), 0.001 * (1 + rng() % 1000)));
    }
    const int64_t fixed = (rng() % 100) * 999'983LL;
    const int64_t budget = fixed + (1 + rng() % 8000) * 1'000'000LL;
    const Best want = brute_force(b, fixed, budget);
    const CheckpointPlan got = plan_checkpoints(b, fixed, budget);
    ASSERT_EQ(got.feasible, want.feasible) << "trial " << trial;  // the least-peak fallback keeps this exact
    if (want.feasible) {
      EXPECT_LE(got.peak_bytes, budget);
      EXPECT_GE(got.recompute_seconds, want.seconds - 1e-9);                      // never better than the optimum
      EXPECT_LE(got.recompute_seconds, want.seconds + 1.0) << "trial " << trial;  // and never far off
    }
  }
  std::vector<BlockProfile> many;
  for (int i = 0; i < 500; ++i) many.push_back(block(100'000'000 + i * 1000, 4'000'000, 0.01 + 1e-5 * (i % 7)));
  CheckpointPlan p = plan_checkpoints(many, 1'000'000'000, 20'000'000'000LL);
  ASSERT_TRUE(p.feasible);
  EXPECT_LE(p.peak_bytes, 20'000'000'000LL);
  EXPECT_GT(p.peak_bytes, 19'000'000'000LL);  // uses the budget rather than checkpointing everything
}
