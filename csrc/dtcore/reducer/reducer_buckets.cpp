// The reducer's buckets over its life: built at construction, rebuilt once after the first
// reduction in the order rank 0 observed (unless the graph is dynamic) and into shared memory, cut
// to this rank's shards for zero=2. The rest of the Reducer is in reducer.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "dtcore/common/error.h"
#include "dtcore/common/log.h"
#include "dtcore/reducer/reducer.h"

namespace dtcore {

// Note [Buckets in shared memory]: with zero <= 1, whose buckets live as long as the plan, the
// final plan's buckets of CPU parameters are carved from one shared buffer of the communicator
// when it offers one (Gloo between ranks on one host: Note [Buffers in shared memory]), where
// their all-reduce runs in place, with no copy through the exchange. Each starts on a cache line.
// Allocating the buffer is a collective, so it is made where every rank rebuilds its buckets
// alike, after the first reduction (rebuild_if_needed, outside mu_), even when the order stays:
// the constructor issues no collective, since a copy of a wrapped model (copy.deepcopy on one
// rank) builds a reducer too. zero=2 releases its buckets once the plan is final, so it keeps
// ordinary memory.
// Note [The first plan]: before any backward is observed, gradients are expected to become ready
// in reverse registration order, and buckets are filled in that order, the small first bucket
// reduced first; the first reduced backward then rebuilds them in the order observed on rank 0.
// A graph that may change from step to step (find_unused_parameters without static_graph) keeps
// its first plan for good, since its order changes too, and that plan is grouped as torch DDP
// groups it: filled in registration order, the buckets reduced in reverse, so that which
// parameters share a bucket (what skip_all_reduce_unused_params skips, what torch's logging data
// lists) is torch's.
std::vector<Bucket> Reducer::first_plan() const {
  if (!options_.find_unused_parameters || options_.static_graph) {
    return plan_buckets(specs_, reverse_registration_order(specs_.size()), caps_);
  }
  std::vector<size_t> order = reverse_registration_order(specs_.size());
  std::reverse(order.begin(), order.end());  // registration order
  std::vector<Bucket> plan = plan_buckets(specs_, order, caps_);
  std::reverse(plan.begin(), plan.end());
  return plan;
}

bool Reducer::build_buckets(std::vector<Bucket> plan, bool shared_memory, bool only_into_shared_memory) {
  constexpr int64_t kAlign = 64;  // each bucket starts on a cache line of the shared buffer
  std::vector<BucketShard> shards;
  std::vector<int64_t> numels, starts;  // each bucket's elements (padded for ZeRO) and its byte in the buffer
  int64_t shared_bytes = 0;
  for (const Bucket& bucket : plan) {
    int64_t numel = bucket.numel;
    if (options_.zero > 0) {  // padded: see Note [Shard layout]
      shards.push_back(shard_bucket(bucket, comm_->size(), comm_->rank()));
      numel = shards.back().padded_numel;
    }
    numels.push_back(numel);
    starts.push_back(bucket.device.is_cpu() ? shared_bytes : -1);
    if (bucket.device.is_cpu()) shared_bytes += (numel * c10::elementSize(bucket.dtype) + kAlign - 1) / kAlign * kAlign;
  }
  at::Tensor shared;
  if (shared_memory && shared_bytes > 0) shared = comm_->shared_buffer(shared_bytes);
  if (only_into_shared_memory && !shared.defined()) return false;  // every rank alike: the buffer is all-or-nothing

  std::lock_guard<std::mutex> lock(mu_);
  plan_ = std::move(plan);
  shards_ = std::move(shards);
  std::vector<BucketState> fresh(plan_.size());
  for (size_t b = 0; b < plan_.size(); ++b) {
    const Bucket& bucket = plan_[b];
    const int64_t numel = numels[b];
    if (shared.defined() && starts[b] >= 0) {  // zeroed, as the buffer is
      fresh[b].buffer =
          shared.narrow(0, starts[b], numel * static_cast<int64_t>(c10::elementSize(bucket.dtype))).view(bucket.dtype);
    } else {
      fresh[b].buffer = at::zeros({numel}, at::TensorOptions().dtype(bucket.dtype).device(bucket.device));
    }
    fresh[b].label = detail::cat("bucket ", b + 1, "/", plan_.size());
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      Slot& s = slots_[bucket.params[k]];
      s.bucket = b;
      s.offset = bucket.offsets[k];
      at::Tensor view = fresh[b].buffer.narrow(0, bucket.offsets[k], bucket.numels[k]).view(s.param.sizes());
      // Keep the gradient the parameter holds (its old view, or one from before wrapping); None
      // stays None until a gradient comes (zero=0, see Note [Unused parameters keep None]).
      s.view = view;
      if (s.param.grad().defined()) {
        view.copy_(s.param.grad());
        s.param.mutable_grad() = view;
      } else if (options_.zero > 0) {
        s.param.mutable_grad() = view;
      }
    }
  }
  buckets_ = std::move(fresh);
  buckets_shared_ = shared.defined();
  ++plan_version_;
  reset_locked();
  return true;
}

void Reducer::shard_gradients_locked() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& state = buckets_[b];
    state.grad_shard = state.buffer.narrow(0, shards_[b].begin, shards_[b].shard_numel).clone();
    state.shard_is_zero = false;
    state.buffer = at::Tensor();  // from now on allocated only while the bucket is in flight
  }
  for (Slot& s : slots_) {
    s.view = at::Tensor();
    s.param.mutable_grad() = at::Tensor();
  }
  sharded_grads_ = true;
}

bool Reducer::shared_memory_plan() const {  // See Note [Buckets in shared memory]
  return options_.zero <= 1 && comm_->offers_shared_buffers() &&
         std::any_of(specs_.begin(), specs_.end(), [](const GradSpec& g) { return g.device.is_cpu(); });
}

CollectiveCost Reducer::measure_collective_cost(bool shared_memory) {
  // The collective the buckets will issue (an all-reduce; zero=2's reduce-scatter), in the dtype it
  // sends (comm_dtype, else the first bucket's: most models have one), at 64 KiB, 1 MiB and the whole
  // model's gradients (at least 4 MiB, at most 64 MiB), three of each, the fastest counted: the first
  // pays for any skew between the ranks' arrivals. beta the least-squares slope through the three,
  // alpha what the smallest leaves of its time (the line's intercept, which the largest size sets,
  // can come out negative).
  std::vector<Bucket> plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan = plan_;
  }
  if (plan.empty()) return {};
  const c10::ScalarType dtype = options_.comm_dtype.value_or(plan.front().dtype);
  const c10::Device device = plan.front().device;
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t total = 0;  // the bytes the buckets send
  for (const Bucket& b : plan) total += b.numel * element;
  const int64_t unit = 4096 * comm_->size();  // whole elements, and whole shards for a reduce-scatter
  std::vector<int64_t> sizes{64 << 10, 1 << 20, std::clamp<int64_t>(total, 4 << 20, 64 << 20)};
  for (size_t i = 0; i < sizes.size(); ++i) {  // multiples of `unit`, each larger than the one before
    sizes[i] = std::max<int64_t>(sizes[i] / unit * unit, i ? sizes[i - 1] + unit : unit);
  }
  const int64_t largest = sizes.back();
  at::Tensor scratch;
  if (shared_memory && device.is_cpu()) scratch = comm_->shared_buffer(largest);  // where the buckets will be
  if (!scratch.defined()) scratch = at::zeros({largest}, at::TensorOptions().dtype(at::kByte).device(device));
  scratch = scratch.view(dtype);
  std::vector<double> seconds;
  for (int64_t bytes : sizes) {
    const at::Tensor input = scratch.narrow(0, 0, bytes / element);
    double best = std::numeric_limits<double>::infinity();
    for (int repeat = 0; repeat < 3; ++repeat) {
      const auto start = std::chrono::steady_clock::now();
      if (options_.zero == 2) {  // each rank keeps its shard: Note [Shard layout]
        at::Tensor output = at::empty({input.numel() / comm_->size()}, input.options());
        comm_->reduce_scatter(output, input, ReduceOp::Avg, "bucket cost probe")->wait();
      } else {
        comm_->all_reduce(input, ReduceOp::Sum, "bucket cost probe")->wait();
      }
      best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count());
    }
    seconds.push_back(best);
  }
  double mx = 0, my = 0, sxy = 0, sxx = 0;  // beta: the least-squares slope through the three
  for (size_t i = 0; i < sizes.size(); ++i) {
    mx += static_cast<double>(sizes[i]) / 3;
    my += seconds[i] / 3;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    sxy += (static_cast<double>(sizes[i]) - mx) * (seconds[i] - my);
    sxx += (static_cast<double>(sizes[i]) - mx) * (static_cast<double>(sizes[i]) - mx);
  }
  CollectiveCost cost;
  cost.beta_ns_per_byte = std::max(0.0, sxy / sxx);
  cost.alpha_ns = std::max(0.0, seconds[0] - cost.beta_ns_per_byte * static_cast<double>(sizes[0]));
  // Per byte of gradient (the planner counts buckets in their own dtype), where comm_dtype sends fewer.
  cost.beta_ns_per_byte *= static_cast<double>(element) / static_cast<double>(c10::elementSize(plan.front().dtype));
  return cost;
}

void Reducer::rebuild_if_needed() {
  // Rank 0's observed order (and, for bucket_mb="auto", its times and its measured collective cost),
  // so that every rank builds the same buckets (their collectives must pair up), whatever order
  // autograd ran in on each.
  std::vector<size_t> order;
  std::vector<int64_t> times;
  std::vector<c10::Event> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    order = ready_order_;
    times = ready_times_;
    events = std::move(ready_events_);
    ready_events_.clear();
  }
  // CUDA: when the device got there, not the host (which runs ahead). Rank 0's times are the ones
  // broadcast, so only it reads them; an event it cannot time leaves the host's clock.
  bool device_clock = false;
  if (comm_->rank() == 0 && !events.empty() && events.size() == times.size()) {
    try {
      std::vector<int64_t> device_times(times.size(), times[0]);
      for (c10::Event& e : events) e.synchronize();
      for (size_t i = 1; i < times.size(); ++i) {
        const auto ns = static_cast<int64_t>(std::llround(events.front().elapsedTime(events[i]) * 1e6));
        device_times[i] = std::max(device_times[i - 1], times[0] + ns);
      }
      times = std::move(device_times);
      device_clock = true;
    } catch (const c10::Error& e) {
      log::warn("reducer: bucket_mb=auto times the first backward by the host's clock: ", e.what_without_backtrace());
    }
  }
  const size_t n = slots_.size();
  const bool shared_memory = shared_memory_plan();  // the same decision on every rank
  // Every rank alike, by the one option the ranks agree on at wrap: the probe is a collective.
  const bool measure = options_.auto_buckets;
  const CollectiveCost measured = measure ? measure_collective_cost(shared_memory) : CollectiveCost{};
  at::Tensor shared = at::full({static_cast<int64_t>(measure ? 2 * n + 3 : n)}, -1, at::kLong);
  int64_t* out = shared.data_ptr<int64_t>();
  if (order.size() == n) {  // else this rank saw fewer: -1 says "no complete order"
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(order[i]);
    if (measure && times.size() == n) {
      for (size_t i = 0; i < n; ++i) out[n + i] = times[i] - times[0];
    }
  }
  if (measure) {  // whole nanoseconds, and femtoseconds per byte
    out[2 * n] = std::llround(measured.alpha_ns);
    out[2 * n + 1] = std::llround(measured.beta_ns_per_byte * 1e6);
    out[2 * n + 2] = device_clock ? 1 : 0;
  }
  if (comm_->backend() == "nccl") shared = shared.to(plan_.empty() ? c10::Device(c10::kCPU) : plan_[0].device);
  comm_->broadcast(shared, 0)->wait();
  shared = shared.cpu();
  const int64_t* in = shared.data_ptr<int64_t>();
  std::vector<size_t> chosen(n);
  std::vector<int64_t> chosen_times(measure ? n : 0);
  bool complete = true;  // rank 0 saw every gradient
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan_final_ = true;  // every rank decides alike, from rank 0's broadcast
    // A graph that changes from step to step keeps its first plan: See Note [The first plan]
    // (broadcast all the same, so that every rank issues the same collectives whatever its options).
    order_rebuilt_ = !options_.find_unused_parameters || options_.static_graph;
    for (size_t i = 0; i < n; ++i) {
      if (in[i] < 0) complete = false;
      chosen[i] = static_cast<size_t>(std::max<int64_t>(in[i], 0));
      if (measure) chosen_times[i] = in[n + i];
    }
  }
  std::vector<Bucket> plan;
  if (!order_rebuilt_ || !complete) {
    plan = first_plan();
  } else if (measure) {  // See Note [Buckets that size themselves]
    const CollectiveCost cost{static_cast<double>(in[2 * n]), static_cast<double>(in[2 * n + 1]) * 1e-6};
    plan = plan_buckets_auto(specs_, chosen, chosen_times, cost);
    AutoPlanInfo info;
    info.chosen = true;
    info.device_clock = in[2 * n + 2] != 0;
    info.alpha_us = cost.alpha_ns / 1e3;
    info.us_per_mib = cost.beta_ns_per_byte * (1 << 20) / 1e3;
    info.backward_ms = n ? static_cast<double>(chosen_times.back()) / 1e6 : 0.0;
    info.exposed_ms = exposed_ns(plan, chosen, chosen_times, specs_, cost) / 1e6;
    info.default_exposed_ms = exposed_ns(plan_buckets(specs_, chosen, caps_), chosen, chosen_times, specs_, cost) / 1e6;
    std::string sizes;
    for (const Bucket& b : plan) {
      char mib[32];
      std::snprintf(mib, sizeof mib, "%s%.2f", sizes.empty() ? "" : ", ", static_cast<double>(b.bytes()) / (1 << 20));
      sizes += mib;
    }
    if (comm_->rank() == 0) {
      log::info("reducer: bucket_mb=auto chose ", plan.size(), " bucket(s) of [", sizes,
                "] MiB from the first backward (", info.backward_ms,
                " ms, first gradient to last) and one all-reduce's "
                "measured cost (",
                info.alpha_us, " us + ", info.us_per_mib, " us/MiB): ", info.exposed_ms,
                " ms of communication expected after the backward (", options_.bucket_mb,
                " MiB buckets: ", info.default_exposed_ms, " ms)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto_info_ = info;
  } else {
    plan = plan_buckets(specs_, chosen, caps_);
  }
  if (options_.auto_buckets && !order_rebuilt_ && comm_->rank() == 0) {
    log::info("reducer: bucket_mb=auto keeps its first plan (", options_.bucket_mb,
              " MiB buckets): with find_unused_parameters and no static_graph the order of gradients may change "
              "from step to step. Fix: static_graph=True if the model uses the same parameters every step.");
  }
  bool same_plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    same_plan = plan.size() == plan_.size() &&
                std::equal(plan.begin(), plan.end(), plan_.begin(),
                           [](const Bucket& a, const Bucket& b) { return a.params == b.params; });
  }
  if (same_plan && !shared_memory) return;  // the plan already matches
  // A collective (the shared buffer), so outside mu_; the same plan only into a shared buffer.
  if (!build_buckets(std::move(plan), shared_memory, /*only_into_shared_memory=*/same_plan)) return;
  std::lock_guard<std::mutex> lock(mu_);
  log::debug("reducer: buckets rebuilt", same_plan ? "" : " in the order gradients became ready",
             buckets_shared_ ? " in shared memory" : "", " (", plan_.size(), " bucket(s))");
}

Reducer::AutoPlanInfo Reducer::auto_plan_info() const {
  std::lock_guard<std::mutex> lock(mu_);
  return auto_info_;
}

void Reducer::adopt_plan(const std::vector<std::vector<size_t>>& buckets) {
  std::vector<size_t> seen(slots_.size(), 0);
  std::vector<Bucket> plan;
  for (const auto& members : buckets) {
    DTCORE_CHECK(!members.empty(), ConfigError, "adopt_plan: an empty bucket. Fix: pass bucket_params() of a model ",
                 "with the same parameters.");
    for (size_t index : members) {
      DTCORE_CHECK(index < slots_.size() && seen[index]++ == 0, ConfigError, "adopt_plan: parameter index ", index,
                   index < slots_.size() ? " is listed twice" : " is out of range", " (", slots_.size(),
                   " trainable parameters). Fix: pass bucket_params() of a model with the same parameters.");
      const GradSpec& g = specs_[index];
      const GradSpec& first = specs_[members.front()];
      DTCORE_CHECK(g.dtype == first.dtype && g.device == first.device, ConfigError, "adopt_plan: parameter '",
                   slots_[index].name,
                   "' does not share its bucket's dtype and device. Fix: pass bucket_params() of a ",
                   "model with the same parameters.");
    }
    plan.push_back(bucket_of(specs_, members));
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    DTCORE_CHECK(seen[i] == 1, ConfigError, "adopt_plan: parameter '", slots_[i].name,
                 "' is in no bucket. Fix: pass bucket_params() of a model with the same parameters.");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    DTCORE_CHECK(!plan_final_ && reductions_ == 0 && !backward_started_, ConfigError,
                 "adopt_plan: the buckets are already final (after the first reduced backward). Fix: adopt a saved "
                 "plan before the first backward, as load_checkpoint does.");
  }
  build_buckets(std::move(plan), shared_memory_plan(), /*only_into_shared_memory=*/false);  // a collective
  std::lock_guard<std::mutex> lock(mu_);
  plan_final_ = true;  // once built: a failed build leaves the first plan, still to be rebuilt
  order_rebuilt_ = !options_.find_unused_parameters || options_.static_graph;  // as rebuild_if_needed()
}

}  // namespace dtcore
