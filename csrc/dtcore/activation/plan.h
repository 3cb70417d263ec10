// Checkpoint planning: which repeated blocks to recompute in backward, and how, so that activation
// memory stays under a budget with the least recompute time.
//
// dtcore.checkpoint_activations(model, policy="budget:...") profiles one step (per block: bytes
// held for backward in each mode, recompute times), then asks plan_checkpoints() for the modes.
// The memory model and the algorithm are in Note [Checkpoint peak model].
//
// Thread safety: pure functions over plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// Note [Checkpoint peak model]
// Blocks run in order 0..n-1 in forward and n-1..0 in backward. Block i holds s_i bytes from its
// forward until its backward, by its mode:
//   kKeep       activation_bytes a_i (everything saved for backward, its inputs included)
//   kFull       input_bytes x_i (the inputs kept for the recompute)
//   kSelective  selective_bytes h_i (its inputs and the outputs of the operators it keeps)
// A storage two blocks hold (a block's saved output that is the next block's input) is in the
// sizes of both, so that it is counted whichever of them is checkpointed; where both are kept it
// is counted twice, which only overestimates. `fixed` is held by everything outside the blocks
// for the whole step. The step's peak is the
// larger of
//   - the end of forward:  fixed + sum_i s_i
//   - the recompute of block j in backward (blocks after j are freed by then):
//       kFull:       fixed + sum_{i<j} s_i + a_j              (its activations exist again)
//       kSelective:  fixed + sum_{i<j} s_i + a_j + h_j - o_j  (and the kept outputs that are not
//                    among them: o_j, selective_shared_bytes, is what both hold, x_j at least)
// Minimising the recompute time (forward_seconds for kFull, selective_seconds for kSelective)
// under peak <= budget is a multiple-choice knapsack with an order-dependent side constraint;
// plan_checkpoints() solves it by dynamic programming over blocks in forward order, the state
// being the bytes held by the blocks so far. Sizes are quantised up to at most kPlanStates steps,
// so a plan it calls feasible is under the exact model (never optimistic); with sizes below
// kPlanStates the plan is exactly optimal. python/dtcore/_activation_profile.py measures the sizes
// and times to match; tests/py/test_activation.py checks the model against measured peaks.

namespace dtcore::activation {

enum class Mode : uint8_t { kKeep = 0, kFull = 1, kSelective = 2 };

struct BlockProfile {
  std::string name;
  int64_t activation_bytes = 0;         // a_i: held for backward when kept (inputs included)
  int64_t input_bytes = 0;              // x_i: held when fully checkpointed
  double forward_seconds = 0.0;         // the recompute cost when fully checkpointed
  int64_t selective_bytes = -1;         // h_i: held when selectively checkpointed; -1: not an option
  double selective_seconds = 0.0;       // the recompute cost when selectively checkpointed
  int64_t selective_shared_bytes = -1;  // o_i: held both when kept and when selective; -1: input_bytes
};

struct CheckpointPlan {
  bool feasible = false;
  std::vector<Mode> modes;          // per block, in the order given (all kKeep when infeasible)
  int64_t peak_bytes = 0;           // predicted peak of the plan (exact model)
  double recompute_seconds = 0.0;   // the recompute time of the plan
  int64_t min_peak_bytes = 0;       // the smallest peak any choice achieves (quoted when infeasible)
  int64_t baseline_peak_bytes = 0;  // the peak with every block kept
};

// At most this many byte steps in the dynamic programme (memory: blocks x kPlanStates bytes).
inline constexpr int64_t kPlanStates = 1 << 15;

// The peak of one choice under Note [Checkpoint peak model]. `modes` has one entry per block
// (std::invalid_argument otherwise, and for kSelective on a block without that option).
int64_t predicted_peak(const std::vector<BlockProfile>& blocks, int64_t fixed_bytes, const std::vector<Mode>& modes);

// The recompute time of one choice.
double recompute_seconds(const std::vector<BlockProfile>& blocks, const std::vector<Mode>& modes);

// The least-recompute choice whose peak is <= budget_bytes; ties in recompute time go to the
// lower peak. Negative sizes or times, or a budget that is not positive, are dtcore::ConfigError
// naming the value.
CheckpointPlan plan_checkpoints(const std::vector<BlockProfile>& blocks, int64_t fixed_bytes, int64_t budget_bytes);

}  // namespace dtcore::activation
