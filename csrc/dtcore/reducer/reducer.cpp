#include "dtcore/reducer/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dtcore/common/error.h"
#include "dtcore/common/log.h"

namespace dtcore {

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<Communicator> comm,
                 BucketCaps caps)
    : comm_(std::move(comm)) {
  DTCORE_CHECK(params.size() == names.size(), ConfigError, "Reducer: ", params.size(), " parameters but ",
               names.size(), " names.");
  std::vector<GradSpec> specs;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    if (!p.requires_grad()) continue;
    DTCORE_CHECK(!p.is_sparse() && p.layout() == at::kStrided, ConfigError, "parameter '", names[i],
                 "' is not a dense tensor; dtcore reduces dense gradients only.");
    Slot s;
    s.param = p;
    s.name = names[i];
    slots_.push_back(std::move(s));
    specs.push_back(GradSpec{p.numel(), p.scalar_type(), p.device()});
  }
  plan_ = plan_buckets(specs, reverse_registration_order(specs.size()), caps);

  buckets_.resize(plan_.size());
  for (size_t b = 0; b < plan_.size(); ++b) {
    const Bucket& bucket = plan_[b];
    buckets_[b].buffer = at::zeros({bucket.numel}, at::TensorOptions().dtype(bucket.dtype).device(bucket.device));
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      Slot& s = slots_[bucket.params[k]];
      s.bucket = b;
      s.view = buckets_[b].buffer.narrow(0, bucket.offsets[k], bucket.numels[k]).view(s.param.sizes());
      // Start from the gradient the parameter already has, if any (e.g. a model trained before).
      if (s.param.grad().defined()) s.view.copy_(s.param.grad());
      s.param.mutable_grad() = s.view;
    }
  }
  reset_locked();

  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    s.accumulator = torch::autograd::impl::grad_accumulator(s.param);
    DTCORE_CHECK(s.accumulator, ConfigError, "parameter '", s.name, "' is not a leaf tensor; wrap the module that "
                 "owns it, not a view or a computed tensor.");
    s.hook_key = s.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          on_grad_ready(i);
          return outputs;
        }));
  }
  log::debug("reducer: ", slots_.size(), " gradients in ", plan_.size(), " bucket(s)");
}

Reducer::~Reducer() {
  for (Slot& s : slots_) {
    if (s.accumulator) s.accumulator->del_post_hook(s.hook_key);
  }
}

int64_t Reducer::reductions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reductions_;
}

void Reducer::prepare_for_backward() {
  std::vector<std::shared_ptr<Work>> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!in_backward_) return;
    for (auto& b : buckets_) {
      if (b.work) stale.push_back(b.work);
    }
  }
  log::warn("reducer: the previous backward pass did not finish; draining ", stale.size(),
            " collective(s) before the next one");
  for (auto& w : stale) {
    try {
      w->wait(comm_->timeout());
    } catch (const std::exception&) {
      // Already reported by the failed backward; the state is reset below either way.
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  reset_locked();
}

void Reducer::set_require_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  require_sync_ = sync;
}

void Reducer::reset_locked() {
  for (size_t b = 0; b < plan_.size(); ++b) {
    buckets_[b].pending = plan_[b].params.size();
    buckets_[b].work.reset();
  }
  for (Slot& s : slots_) s.ready = false;
  in_backward_ = false;
  next_bucket_ = 0;
}

void Reducer::launch_ready_locked() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    BucketState& b = buckets_[next_bucket_++];
    b.work = comm_->allreduce(b.buffer, ReduceOp::Avg);  // overlaps with the rest of backward
  }
}

void Reducer::adopt_grad_locked(Slot& s) {
  // A replaced .grad (set_to_none, or a user assignment) goes back into the bucket.
  const at::Tensor& grad = s.param.grad();
  if (grad.defined() && grad.is_alias_of(s.view)) return;
  if (grad.defined()) {
    s.view.copy_(grad);
  } else {
    s.view.zero_();
  }
  s.param.mutable_grad() = s.view;
}

void Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!require_sync_) {  // no_sync: accumulate locally, in the bucket
    adopt_grad_locked(slots_[index]);
    return;
  }
  if (!in_backward_) {
    in_backward_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
  }
  Slot& s = slots_[index];
  if (s.ready) reset_locked();  // the error below ends this backward; the next starts clean
  DTCORE_CHECK(!s.ready, CommError, "parameter '", s.name, "' received a second gradient in one backward pass on "
               "rank ", comm_->rank(), ", so its reduction has already started. Fix: use each parameter once per "
               "backward, or accumulate over several backward passes before the one that reduces.");
  s.ready = true;
  adopt_grad_locked(s);
  if (--buckets_[s.bucket].pending == 0) launch_ready_locked();
}

void Reducer::finalize() {
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].pending == 0) continue;
    for (size_t p : plan_[b].params) {
      if (!slots_[p].ready) {
        std::string name = slots_[p].name;
        reset_locked();
        DTCORE_CHECK(false, ConfigError, "parameter '", name, "' received no gradient in this backward pass on rank ",
                     comm_->rank(), ", so its bucket could not be reduced (the other ranks wait for it). Fix: make "
                     "every parameter that requires grad take part in the loss, or freeze it with "
                     "requires_grad_(False) before wrapping.");
      }
    }
  }
  std::vector<std::shared_ptr<Work>> works;
  for (auto& b : buckets_) works.push_back(b.work);
  lock.unlock();
  // Waited without the lock: a hook of the next backward cannot run before this returns anyway.
  std::exception_ptr failure;
  for (auto& w : works) {
    try {
      if (w) w->wait(comm_->timeout());
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  lock.lock();
  reset_locked();
  if (failure) std::rethrow_exception(failure);
  ++reductions_;
}

}  // namespace dtcore
