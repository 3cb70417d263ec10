#include "dtcore/activation/plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "dtcore/common/error.h"

namespace dtcore::activation {
namespace {

constexpr std::array<Mode, 3> kModes{Mode::kKeep, Mode::kFull, Mode::kSelective};

void check_inputs(const std::vector<BlockProfile>& blocks, int64_t fixed_bytes) {
  DTCORE_CHECK(fixed_bytes >= 0, ConfigError, "the fixed activation bytes outside the blocks are ", fixed_bytes,
               "; they must be >= 0. Fix: pass the bytes held outside the checkpointed blocks, or 0.");
  for (const BlockProfile& b : blocks) {
    DTCORE_CHECK(
        b.activation_bytes >= 0 && b.input_bytes >= 0 && b.selective_bytes >= -1 && b.selective_shared_bytes >= -1,
        ConfigError, "block '", b.name, "' has activation_bytes=", b.activation_bytes, ", input_bytes=", b.input_bytes,
        " and selective_bytes=", b.selective_bytes,
        "; sizes must be >= 0 (selective_bytes -1: no selective option). Fix: pass the measured byte counts.");
    DTCORE_CHECK(std::isfinite(b.forward_seconds) && b.forward_seconds >= 0 && std::isfinite(b.selective_seconds) &&
                     b.selective_seconds >= 0,
                 ConfigError, "block '", b.name, "' has forward_seconds=", b.forward_seconds,
                 " and selective_seconds=", b.selective_seconds, "; times must be finite and >= 0.");
  }
}

bool available(const BlockProfile& b, Mode m) { return m != Mode::kSelective || b.selective_bytes >= 0; }

// Bytes block b holds from its forward to its backward. See Note [Checkpoint peak model].
int64_t held(const BlockProfile& b, Mode m) {
  switch (m) {
    case Mode::kKeep: return b.activation_bytes;
    case Mode::kFull: return b.input_bytes;
    case Mode::kSelective: return b.selective_bytes;
  }
  return b.activation_bytes;
}

// What exists again while block b recomputes, beyond the blocks before it (0 when kept).
int64_t recompute_extra(const BlockProfile& b, Mode m) {
  switch (m) {
    case Mode::kKeep: return 0;
    case Mode::kFull: return b.activation_bytes;
    case Mode::kSelective: {
      const int64_t shared = b.selective_shared_bytes >= 0 ? b.selective_shared_bytes : b.input_bytes;
      return b.activation_bytes + std::max<int64_t>(0, b.selective_bytes - shared);
    }
  }
  return 0;
}

double cost(const BlockProfile& b, Mode m) {
  return m == Mode::kFull ? b.forward_seconds : m == Mode::kSelective ? b.selective_seconds : 0.0;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// a < b beyond rounding of sums taken in different orders.
bool less_time(double a, double b) { return a < b - 1e-12 * std::max(1.0, std::abs(b)); }

// One DP state: the best path so far into "quantised bytes held by the blocks seen = S".
struct State {
  double seconds = std::numeric_limits<double>::infinity();  // infinity: unreachable
  int64_t prefix = 0;                                        // exact bytes held by the blocks seen, on this path
  int64_t recompute_peak = 0;  // exact max of the recompute terms of its checkpointed blocks
  bool reachable() const { return std::isfinite(seconds); }
  int64_t peak(int64_t fixed) const { return std::max(recompute_peak, fixed + prefix); }
};

// Whether `c` beats `cur`: less recompute time, then a lower peak so far.
bool better(const State& c, const State& cur, int64_t fixed) {
  if (!cur.reachable()) return true;
  if (less_time(c.seconds, cur.seconds)) return true;
  if (less_time(cur.seconds, c.seconds)) return false;
  return c.peak(fixed) < cur.peak(fixed);
}

// The choice of least peak: kFull for every block whose inputs are smaller than its activations.
// kFull beats kSelective on both terms (x_i <= h_i); it lowers every later term, and its own
// recompute term is below the end-of-forward term it removes.
std::vector<Mode> least_peak_choice(const std::vector<BlockProfile>& blocks) {
  std::vector<Mode> c(blocks.size(), Mode::kKeep);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].input_bytes < blocks[i].activation_bytes) c[i] = Mode::kFull;
  }
  return c;
}

}  // namespace

int64_t predicted_peak(const std::vector<BlockProfile>& blocks, int64_t fixed_bytes, const std::vector<Mode>& modes) {
  if (modes.size() != blocks.size()) {
    throw std::invalid_argument("predicted_peak: " + std::to_string(modes.size()) + " modes for " +
                                std::to_string(blocks.size()) + " blocks");
  }
  int64_t prefix = 0, peak = fixed_bytes;
  for (size_t i = 0; i < blocks.size(); ++i) {
    DTCORE_CHECK(available(blocks[i], modes[i]), ConfigError, "block '", blocks[i].name,
                 "' has no selective option (selective_bytes=-1). Fix: profile it with selective checkpointing.");
    if (modes[i] != Mode::kKeep) peak = std::max(peak, fixed_bytes + prefix + recompute_extra(blocks[i], modes[i]));
    prefix += held(blocks[i], modes[i]);
  }
  return std::max(peak, fixed_bytes + prefix);
}

double recompute_seconds(const std::vector<BlockProfile>& blocks, const std::vector<Mode>& modes) {
  double s = 0.0;
  for (size_t i = 0; i < blocks.size() && i < modes.size(); ++i) s += cost(blocks[i], modes[i]);
  return s;
}

CheckpointPlan plan_checkpoints(const std::vector<BlockProfile>& blocks, int64_t fixed_bytes, int64_t budget_bytes) {
  check_inputs(blocks, fixed_bytes);
  DTCORE_CHECK(budget_bytes > 0, ConfigError, "the activation memory budget is ", budget_bytes,
               " bytes; it must be positive. Fix: pass e.g. policy=\"budget:2GB\".");
  const size_t n = blocks.size();
  CheckpointPlan plan;
  plan.modes.assign(n, Mode::kKeep);
  plan.baseline_peak_bytes = predicted_peak(blocks, fixed_bytes, plan.modes);
  const std::vector<Mode> least = least_peak_choice(blocks);
  plan.min_peak_bytes = predicted_peak(blocks, fixed_bytes, least);
  if (plan.min_peak_bytes > budget_bytes) return plan;  // infeasible: min_peak_bytes says by how much

  // Quantise so that at most kPlanStates + 1 states exist; sizes round up, the capacity down, so
  // a quantised-feasible path is feasible under the exact model. See Note [Checkpoint peak model].
  const int64_t capacity = budget_bytes - fixed_bytes;  // >= 0: min_peak_bytes >= fixed_bytes
  const int64_t quantum = std::max<int64_t>(1, ceil_div(capacity, kPlanStates));
  const int64_t cap_q = capacity / quantum;
  const size_t states = static_cast<size_t>(cap_q) + 1;
  std::vector<State> cur(states), next(states);
  cur[0] = State{0.0, 0, 0};
  std::vector<Mode> chose(n * states, Mode::kKeep);  // chose[i * states + S]: block i's mode on the best path into S
  for (size_t i = 0; i < n; ++i) {
    const BlockProfile& b = blocks[i];
    std::fill(next.begin(), next.end(), State{});
    for (Mode m : kModes) {
      if (!available(b, m)) continue;
      const int64_t held_q = ceil_div(held(b, m), quantum), extra_q = ceil_div(recompute_extra(b, m), quantum);
      for (int64_t s = 0; s + held_q <= cap_q; ++s) {
        const State& from = cur[static_cast<size_t>(s)];
        if (!from.reachable() || s + extra_q > cap_q) continue;  // the recompute must fit too
        State c{from.seconds + cost(b, m), from.prefix + held(b, m), from.recompute_peak};
        if (m != Mode::kKeep)
          c.recompute_peak = std::max(c.recompute_peak, fixed_bytes + from.prefix + recompute_extra(b, m));
        State& to = next[static_cast<size_t>(s + held_q)];
        if (better(c, to, fixed_bytes)) {
          to = c;
          chose[i * states + static_cast<size_t>(s + held_q)] = m;
        }
      }
    }
    std::swap(cur, next);
  }

  int64_t best = -1;
  for (int64_t s = 0; s <= cap_q; ++s) {
    const State& c = cur[static_cast<size_t>(s)];
    if (c.reachable() && (best < 0 || better(c, cur[static_cast<size_t>(best)], fixed_bytes))) best = s;
  }
  if (best < 0) {
    plan.modes = least;  // only quantisation lost it (the least-peak choice fits exactly)
  } else {
    for (size_t i = n; i-- > 0;) {  // walk the choices back from the final state
      const Mode m = chose[i * states + static_cast<size_t>(best)];
      plan.modes[i] = m;
      best -= ceil_div(held(blocks[i], m), quantum);
    }
  }
  plan.peak_bytes = predicted_peak(blocks, fixed_bytes, plan.modes);
  plan.recompute_seconds = recompute_seconds(blocks, plan.modes);
  if (plan.peak_bytes > budget_bytes) {
    throw std::logic_error("dtcore bug: checkpoint plan exceeds its budget (" + std::to_string(plan.peak_bytes) +
                           " > " + std::to_string(budget_bytes) + ")");
  }
  plan.feasible = true;
  return plan;
}

}  // namespace dtcore::activation
