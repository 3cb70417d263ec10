// The reducer's buckets over its life: built at construction, rebuilt once after the first
// reduction in the order rank 0 observed (unless the graph is dynamic) and into shared memory, cut
// to this rank's shards for zero=2. The rest of the Reducer is in reducer.cpp.
#include <algorithm>
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

void Reducer::rebuild_if_needed() {
  // Rank 0's observed order, so that every rank builds the same buckets (their collectives must
  // pair up), whatever order autograd ran in on each.
  std::vector<size_t> order;
  {
    std::lock_guard<std::mutex> lock(mu_);
    order = ready_order_;
  }
  at::Tensor shared = at::full({static_cast<int64_t>(slots_.size())}, -1, at::kLong);
  if (order.size() == slots_.size()) {  // else this rank saw fewer: -1 says "no complete order"
    int64_t* out = shared.data_ptr<int64_t>();
    for (size_t i = 0; i < order.size(); ++i) out[i] = static_cast<int64_t>(order[i]);
  }
  if (comm_->backend() == "nccl") shared = shared.to(plan_.empty() ? c10::Device(c10::kCPU) : plan_[0].device);
  comm_->broadcast(shared, 0)->wait();
  shared = shared.cpu();
  const int64_t* in = shared.data_ptr<int64_t>();
  std::vector<size_t> chosen(slots_.size());
  bool complete = true;  // rank 0 saw every gradient
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan_final_ = true;  // every rank decides alike, from rank 0's broadcast
    // A graph that changes from step to step keeps its first plan: See Note [The first plan]
    // (broadcast all the same, so that every rank issues the same collectives whatever its options).
    order_rebuilt_ = !options_.find_unused_parameters || options_.static_graph;
    for (size_t i = 0; i < chosen.size(); ++i) {
      if (in[i] < 0) complete = false;
      chosen[i] = static_cast<size_t>(std::max<int64_t>(in[i], 0));
    }
  }
  std::vector<Bucket> plan = order_rebuilt_ && complete ? plan_buckets(specs_, chosen, caps_) : first_plan();
  // The same decision on every rank: See Note [Buckets in shared memory].
  const bool shared_memory =
      options_.zero <= 1 && comm_->offers_shared_buffers() &&
      std::any_of(specs_.begin(), specs_.end(), [](const GradSpec& g) { return g.device.is_cpu(); });
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

}  // namespace dtcore
