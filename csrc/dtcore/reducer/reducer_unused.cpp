// Parameters that get no gradient in a backward: the graph search of find_unused_parameters, the
// used map summed across ranks (Note [Unused parameters keep None]), static graphs (Note [Static
// graph]) and skipped buckets (Note [Skipped buckets]). The rest of the Reducer is in reducer.cpp.
#include <algorithm>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "dtcore/common/error.h"
#include "dtcore/common/log.h"
#include "dtcore/reducer/reducer.h"

namespace dtcore {

void Reducer::set_find_unused_parameters(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  DTCORE_CHECK(!backward_started_, ConfigError, "find_unused_parameters was changed on rank ", comm_->rank(),
               " while a backward pass is reducing gradients. Fix: change it before the forward or after the "
               "backward.");
  options_.find_unused_parameters = on;
}

bool Reducer::find_unused_parameters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.find_unused_parameters;
}

void Reducer::set_static_graph() {
  std::lock_guard<std::mutex> lock(mu_);
  DTCORE_CHECK(
      reductions_ == 0 && !backward_started_, ConfigError,  // torch's words first: scripts match them
      "set_static_graph() should be called before training loop starts and after DistributedDataParallel "
      "is constructed: this model has already reduced gradients on rank ",
      comm_->rank(),
      ". Fix: pass DistributedDataParallel(..., static_graph=True), or call _set_static_graph() before the first "
      "backward.");
  options_.static_graph = true;
  options_.find_unused_parameters = true;  // the first backward searches the graph: See Note [Static graph]
}

bool Reducer::static_graph() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.static_graph;
}

bool Reducer::static_graph_recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_recorded_;
}

void Reducer::find_unused(const std::vector<at::Tensor>& outputs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!options_.find_unused_parameters) return;
    if (static_recorded_) {  // See Note [Static graph]: the first reduced backward's, no search
      unused_.clear();
      if (!expect_hooks_) return;
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].static_unused) unused_.push_back(i);
      }
      return;
    }
  }
  RECORD_USER_SCOPE("dtcore.reducer::search_unused_parameters");  // torch DDP's name for it, in profiles
  // Every node the outputs' graph reaches; a parameter whose accumulator is not among them gets
  // no gradient in the coming backward.
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& t : outputs) {
    if (!t.defined()) continue;
    if (auto fn = t.grad_fn()) {
      stack.push_back(fn.get());
    } else if (t.requires_grad() && t.is_leaf()) {
      if (auto acc = torch::autograd::impl::try_get_grad_accumulator(t)) seen.insert(acc.get());
    }
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  unused_.clear();
  if (!expect_hooks_) return;  // no_sync: nothing is reduced in this backward
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!seen.count(slots_[i].accumulator.get())) unused_.push_back(i);
  }
}

void Reducer::start_used_map_locked(const std::vector<float>& used) {
  used_map_ = at::tensor(used, at::kFloat);
  if (comm_->backend() == "nccl") used_map_ = used_map_.to(plan_.front().device);
  used_work_ = comm_->all_reduce(used_map_, ReduceOp::Sum, "used parameters");
}

std::vector<float> Reducer::summed_used_map() {
  used_work_->wait();
  at::Tensor summed = used_map_.cpu();
  const float* in = summed.data_ptr<float>();
  return std::vector<float>(in, in + summed.numel());
}

std::vector<size_t> Reducer::skipped_but_used_locked(const std::vector<float>& sums) const {
  std::vector<size_t> out;
  for (size_t b = 0; b < plan_.size(); ++b) {
    const std::vector<size_t>& params = plan_[b].params;
    if (buckets_[b].skip && std::any_of(params.begin(), params.end(), [&](size_t i) { return sums[i] != 0.0f; })) {
      out.push_back(b);
    }
  }
  return out;
}

void Reducer::reduce_skipped_if_used(const std::vector<float>& sums) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t b : skipped_but_used_locked(sums)) {
    log::debug("reducer: ", buckets_[b].label,
               " was skipped as unused, but some rank gave one of its parameters a gradient: reduced at the end of "
               "backward");
    start_bucket_locked(b);  // waited for by finalize() with the others
  }
}

void Reducer::plan_skips_locked(const std::vector<float>& sums) {
  for (size_t b = 0; b < plan_.size(); ++b) {
    const std::vector<size_t>& params = plan_[b].params;
    buckets_[b].skip = options_.skip_all_reduce_unused_params && sums.size() == slots_.size() &&
                       std::all_of(params.begin(), params.end(), [&](size_t i) { return sums[i] == 0.0f; });
  }
}

void Reducer::restore_globally_unused(const std::vector<float>& sums) {
  const float* in = sums.data();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (in[i] != 0.0f) {
      slots_[i].without_grad = false;
    } else if (slots_[i].grad_was_none && !sharded_grads_) {
      slots_[i].param.mutable_grad() = at::Tensor();
    }
  }
}

}  // namespace dtcore
