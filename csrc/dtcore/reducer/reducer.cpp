#include "dtcore/reducer/reducer.h"

#include <chrono>
#include <type_traits>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dtcore/common/dtype.h"
#include "dtcore/common/error.h"
#include "dtcore/common/log.h"

namespace dtcore {

static_assert(std::is_same_v<detail::NodePtr,
                             decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()))>,
              "detail::NodePtr (reducer.h) is not what this torch's grad_accumulator() returns: move its version test");

namespace {
constexpr size_t kShardedInFlight = 0;       // See Note [Buckets in flight]
constexpr size_t kShardedInFlightOnGpu = 1;  // ditto

int64_t now_ns() {  // See Note [Backward timeline]
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
constexpr size_t kDrainFinished = static_cast<size_t>(-1);

// Runs `fn` with the gradients just before its node, passing them on unchanged (torch has a
// LambdaPostHook only). See Note [Lent bucket views].
class LambdaPreHook : public torch::autograd::FunctionPreHook {
 public:
  using Fn = std::function<void(const torch::autograd::variable_list&)>;
  explicit LambdaPreHook(Fn fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    fn_(grads);
    return grads;
  }

 private:
  Fn fn_;
};

// The gradient an AccumulateGrad node was given: undefined behind an output the loss does not use
// (See Note [Outputs the loss does not use]).
bool defined_gradient(const torch::autograd::variable_list& grads) { return !grads.empty() && grads[0].defined(); }
}  // namespace

void Reducer::check_options(const Options& options) {
  mebibytes_to_bytes(options.bucket_mb, "bucket_mb");
  mebibytes_to_bytes(options.first_bucket_mb, "first_bucket_mb");
  if (auto dtype = options.comm_dtype) {
    DTCORE_CHECK(*dtype == at::kBFloat16 || *dtype == at::kHalf || *dtype == at::kFloat, ConfigError,
                 "comm_dtype=", dtype_name(*dtype),
                 " cannot carry gradients. Fix: use torch.bfloat16, torch.float16 or None.");
  }
  DTCORE_CHECK(options.zero >= 0 && options.zero <= 2, ConfigError, "zero=", options.zero,
               " is not a ZeRO stage dtcore offers. Fix: pass zero=0 (whole gradients and optimizer state on every "
               "rank), 1 (optimizer state sharded) or 2 (gradients sharded too).");
  DTCORE_CHECK(!options.skip_all_reduce_unused_params || options.zero == 0, ConfigError,
               "skip_all_reduce_unused_params=True with zero=", options.zero,
               ": a sharded optimizer steps every bucket's shard. Fix: wrap with zero=0 to skip buckets no rank "
               "used, or drop skip_all_reduce_unused_params.");
  DTCORE_CHECK(!options.skip_all_reduce_unused_params || options.find_unused_parameters || options.static_graph,
               ConfigError,
               "skip_all_reduce_unused_params=True without find_unused_parameters=True or static_graph=True: the "
               "unused parameters are found by either. Fix: pass find_unused_parameters=True (or static_graph=True) "
               "as well.");
  DTCORE_CHECK(!options.auto_buckets || options.first_bucket_mb == kDefaultFirstBucketMiB, ConfigError,
               "first_bucket_mb=", options.first_bucket_mb,
               " with bucket_mb='auto': the planner chooses the first bucket too, from the "
               "measured backward. Fix: leave first_bucket_mb out, or give bucket_mb a size in MiB as well (e.g. "
               "bucket_mb=25).");
}

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<Communicator> comm,
                 Options options)
    : comm_(std::move(comm)),
      options_((check_options(options), options)),
      caps_{mebibytes_to_bytes(options.bucket_mb, "bucket_mb"),
            mebibytes_to_bytes(options.first_bucket_mb, "first_bucket_mb")} {
  if (options_.static_graph) options_.find_unused_parameters = true;  // the first backward searches the graph
  DTCORE_CHECK(params.size() == names.size(), ConfigError, "Reducer: ", params.size(), " parameters but ", names.size(),
               " names. Fix: pass one name per parameter (module.named_parameters() gives both).");
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    if (!p.requires_grad()) continue;
    DTCORE_CHECK(!p.is_sparse() && p.layout() == at::kStrided, ConfigError, "parameter '", names[i],
                 "' is not a dense tensor; dtcore reduces dense gradients only. Fix: make it dense, or freeze it with "
                 "requires_grad_(False) and reduce its gradient yourself.");
    DTCORE_CHECK(p.is_leaf(), ConfigError, "parameter '", names[i],
                 "' is not a leaf tensor; wrap the module that "
                 "owns it, not a view or a computed tensor. Fix: pass the module whose parameters these are.");
    Slot s;
    s.param = p;
    s.name = names[i];
    slots_.push_back(std::move(s));
    specs_.push_back(GradSpec{p.numel(), p.scalar_type(), p.device()});
  }
  build_buckets(first_plan(), /*shared_memory=*/false, /*only_into_shared_memory=*/false);

  // See Note [One reducer per parameter]: checked for every parameter before any hook is added.
  for (Slot& s : slots_) {
    s.accumulator = torch::autograd::impl::grad_accumulator(s.param);
    DTCORE_CHECK(s.accumulator->post_hooks().empty(), ConfigError, "parameter '", s.name,
                 "' already carries another reducer's gradient hook (torch.nn.parallel.DistributedDataParallel or "
                 "FSDP built over this module, or over one sharing its parameters): with dtcore's too, two gradient "
                 "reducers would write its .grad during backward and every step would use wrong gradients. Fix: use "
                 "one data-parallel wrapper: drop the torch one (and every reference to it) and wrap the plain "
                 "module with dtcore alone.");
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    s.hook_key = s.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list& inputs) {
          try {
            on_grad_ready(i, defined_gradient(inputs));
          } catch (...) {
            raise(std::current_exception());
          }
          return outputs;
        }));
    if (options_.zero == 0 && s.param.device().is_cpu()) {  // See Note [Lent bucket views]
      auto lend = std::make_unique<LambdaPreHook>([this, i](const torch::autograd::variable_list& grads) {
        try {
          lend_view(i, defined_gradient(grads));
        } catch (...) {
          raise(std::current_exception());
        }
      });
      s.lend_hook = lend.get();
      s.accumulator->add_pre_hook(std::move(lend));
    }
  }
  log::debug("reducer: ", slots_.size(), " gradients in ", plan_.size(), " bucket(s)");
}

Reducer::~Reducer() { remove_hooks_locked(); }

void Reducer::remove_hooks_locked() {
  for (Slot& s : slots_) {
    if (!s.accumulator) continue;
    s.accumulator->del_post_hook(s.hook_key);
    auto& pre = s.accumulator->pre_hooks();  // torch offers no del_pre_hook: found by identity
    std::erase_if(pre, [&s](const auto& hook) { return hook.get() == s.lend_hook; });
    s.accumulator.reset();
  }
}

void Reducer::release_parameters() {
  std::unique_lock<std::mutex> lock(mu_);
  if (backward_started_) drain_unfinished(lock);  // a backward that raised: as prepare_for_backward() does
  remove_hooks_locked();
}

bool Reducer::plan_final() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plan_final_;
}

int64_t Reducer::plan_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plan_version_;
}

std::vector<BucketShard> Reducer::shards() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shards_;
}

std::vector<at::Tensor> Reducer::grad_shards() const {
  std::lock_guard<std::mutex> lock(mu_);
  DTCORE_CHECK(options_.zero > 0, ConfigError,
               "this model was wrapped with zero=0: its gradients are not sharded. Fix: wrap it with "
               "dtcore.wrap(model, zero=1) or zero=2 to use a sharded optimizer.");
  std::vector<at::Tensor> out;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    out.push_back(sharded_grads_ ? buckets_[b].grad_shard
                                 : buckets_[b].buffer.narrow(0, shards_[b].begin, shards_[b].shard_numel));
  }
  return out;
}

void Reducer::zero_grad(bool set_to_none) {
  std::lock_guard<std::mutex> lock(mu_);
  DTCORE_CHECK(!backward_started_, ConfigError,
               "zero_grad() was called while a backward pass is reducing gradients on rank ", comm_->rank(),
               ". Fix: call it before the forward or after the backward, as with any optimizer.");
  for (Slot& s : slots_) s.without_grad = set_to_none;
  if (sharded_grads_) {
    for (BucketState& b : buckets_) {
      b.grad_shard.zero_();
      b.shard_is_zero = true;
    }
    for (Slot& s : slots_) s.param.mutable_grad() = at::Tensor();  // local no_sync() sums are dropped too
    return;
  }
  for (BucketState& b : buckets_) b.buffer.zero_();
  for (Slot& s : slots_) s.param.mutable_grad() = s.view;
}

std::vector<size_t> Reducer::params_without_grad() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<size_t> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].without_grad) out.push_back(i);
  }
  return out;
}

int64_t Reducer::reductions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reductions_;
}

Reducer::BackwardTimes Reducer::last_backward_times() const {
  std::lock_guard<std::mutex> lock(mu_);
  return times_;
}

std::vector<size_t> Reducer::last_ready_order() const {
  std::lock_guard<std::mutex> lock(mu_);
  return grad_order_;
}

void Reducer::drain_unfinished(std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<Work>> launched;
  std::vector<HookFuture> futures;
  for (auto& b : buckets_) {
    if (b.work) launched.push_back(b.work);
    if (b.future) futures.push_back(b.future);
  }
  if (used_work_) launched.push_back(used_work_);
  lock.unlock();
  // Waited (each with the timeout), so that no collective still writes into .grad afterwards;
  // their errors are not the ones to act on: the caller's is.
  for (auto& w : launched) {
    try {
      w->wait();
    } catch (const std::exception&) {
    }
  }
  for (auto& f : futures) {
    try {
      wait_hook_future(f, comm_->timeout(), "a communication hook", comm_->rank());
    } catch (const std::exception&) {
    }
  }
  lock.lock();
  reset_locked();
}

void Reducer::prepare_for_backward(bool sync) {
  std::vector<std::pair<size_t, std::string>> missing;  // (index, name)
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!backward_started_) {  // nothing pending: arm for the coming backward
      reset_locked();
      expect_hooks_ = sync;
      return;
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].ready) missing.emplace_back(i, slots_[i].name);
    }
    drain_unfinished(lock);
  }
  // torch DDP's key phrases (scripts and tests match them), with the indices and names it gives.
  std::string indices, names;
  for (size_t k = 0; k < missing.size(); ++k) {
    indices += detail::cat(k ? " " : "", missing[k].first);
    names += detail::cat(k ? ", " : "", missing[k].second);
  }
  // torch's words for a static graph that changed, up to the indices (scripts and tests match them).
  const std::string lead =
      options_.static_graph
          ? "Expected to have finished reduction in the prior iteration before starting a new one. This error "
            "indicates that your training graph has changed in this iteration, e.g., one parameter is used in first "
            "iteration, but then got unused in the second iteration. this is not compatible with static_graph set "
            "to True.\n"
          : detail::cat(
                "Expected to have finished reduction in the prior iteration before starting a new one: the "
                "previous backward pass on rank ",
                comm_->rank(), " did not complete its gradient reduction. ");
  const std::string cause =
      options_.static_graph ? "Fix: use the same parameters in every step with static_graph=True, or wrap with "
                              "find_unused_parameters=True instead"
      : options_.find_unused_parameters  // outputs the loss does not use are fine: Note [Outputs the loss does not use]
          ? "Since `find_unused_parameters=True` is enabled, this likely means that a backward raised before "
            "reaching these parameters, that the loss was computed from tensors these parameters made outside "
            "the wrapped model's forward, or that the loss left out an output the forward returned inside an "
            "object other than a tensor, list, tuple, dict or dataclass (a SimpleNamespace, say: outputs in those "
            "may go unused). Fix: compute the loss from the wrapped model's outputs, returned in those containers"
          : "Your module has parameters that were not used in producing loss (or that backward raised before "
            "reaching them). Fix: enable unused parameter detection by passing the keyword argument "
            "`find_unused_parameters=True` when wrapping, and make sure all `forward` function outputs participate "
            "in calculating loss; or freeze unused parameters with requires_grad_(False)";
  if (options_.static_graph) {
    DTCORE_CHECK(false, ConfigError, lead, "Parameter indices which did not receive grad for rank ", comm_->rank(),
                 ": ", indices, ". Parameters which did not receive grad for rank ", comm_->rank(), ": ", names,
                 ". (If the previous backward raised \"Your training graph has changed in this iteration\", these "
                 "are the parameters it had not reached when it stopped.) ",
                 cause, "; after a backward that raised, restart the step on every rank.");
  }
  // The parameters are named whatever TORCH_DISTRIBUTED_DEBUG is; torch's advice is quoted for those who
  // search for it.
  DTCORE_CHECK(false, ConfigError, lead, cause,
               "; after a backward that raised, restart the step on every rank. Parameter indices which did not "
               "receive grad for rank ",
               comm_->rank(), ": ", indices, ". Parameters which did not receive grad for rank ", comm_->rank(), ": ",
               names,
               ". dtcore names them whatever TORCH_DISTRIBUTED_DEBUG is (torch DDP names them only if you set the "
               "environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL).");
}

int64_t Reducer::last_buckets_reduced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_buckets_reduced_;
}

bool Reducer::order_rebuilt() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_rebuilt_;
}

Reducer::ErrorRecord Reducer::last_backward_error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return last_error_;
}

void Reducer::reset_locked() {
  for (size_t b = 0; b < plan_.size(); ++b) {
    buckets_[b].pending = plan_[b].params.size();
    buckets_[b].work.reset();
    buckets_[b].sent = at::Tensor();
    buckets_[b].received = at::Tensor();
    buckets_[b].future.reset();
    if (sharded_grads_) buckets_[b].buffer = at::Tensor();  // in flight only
  }
  for (Slot& s : slots_) s.ready = s.used = s.grad_was_none = false;
  used_work_.reset();
  expect_hooks_ = false;
  backward_started_ = false;
  unused_.clear();
  post_futures_.clear();
  divisor_ = 0;
  next_bucket_ = 0;
  drained_ = 0;
  ready_order_.clear();
  ready_times_.clear();
  ready_events_.clear();
}

void Reducer::launch_ready_locked() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    const size_t index = next_bucket_++;
    if (index == 0) times_.comm_start_ns = now_ns();        // See Note [Backward timeline]
    if (!buckets_[index].skip) start_bucket_locked(index);  // See Note [Skipped buckets]
    if (next_bucket_ == buckets_.size()) {
      times_.compute_end_ns = now_ns();       // every gradient is ready: the last bucket starts
      if (options_.find_unused_parameters) {  // See Note [Unused parameters keep None]
        std::vector<float> used(slots_.size());
        for (size_t i = 0; i < slots_.size(); ++i) used[i] = slots_[i].used || slots_[i].used_unsynced ? 1.0f : 0.0f;
        start_used_map_locked(used);
      }
      // The last one: collect them all when this backward ends. Queued now rather than at the
      // first hook, so that a nested backward (reentrant checkpointing) cannot end it early.
      torch::autograd::Engine::get_default_engine().queue_callback([this] {
        try {
          finalize();
        } catch (...) {
          raise(std::current_exception());
        }
        std::lock_guard<std::mutex> lock(mu_);
        times_.comm_end_ns = now_ns();
      });
    }
  }
}

void Reducer::start_bucket_locked(size_t index) {
  BucketState& b = buckets_[index];
  ++buckets_reduced_;
  at::Tensor payload = b.buffer;
  if (options_.comm_dtype && *options_.comm_dtype != b.buffer.scalar_type()) {
    b.sent = b.buffer.to(*options_.comm_dtype);  // copied back into the buffer in finalize()
    payload = b.sent;
  }
  // Overlaps with the rest of backward; the label names it in the flight recorder.
  if (hook_) {
    b.future = run_hook_locked(index, payload);
  } else if (sharded_grads_) {
    // Straight into the shard when it holds zeros (after zero_grad()); else into a buffer that
    // is added to it, as .grad accumulates.
    if (b.sent.defined()) b.buffer = at::Tensor();  // the cast is what is sent
    const bool direct = b.shard_is_zero && payload.scalar_type() == b.grad_shard.scalar_type();
    b.received = direct ? b.grad_shard : at::empty({shards_[index].shard_numel}, payload.options());
    b.work = comm_->reduce_scatter(b.received, payload, ReduceOp::Avg, b.label);
    drain_locked(kDrainFinished);
  } else {
    b.work = comm_->all_reduce(payload, ReduceOp::Avg, b.label);
  }
}

HookFuture Reducer::run_hook_locked(size_t bucket, const at::Tensor& contents) {
  std::vector<at::Tensor> params;
  params.reserve(slots_.size());
  for (const Slot& s : slots_) params.push_back(s.param);
  return hook_bucket(*hook_, plan_, bucket, contents, params, buckets_[bucket].label);
}

void Reducer::register_comm_hook(std::unique_ptr<CommHook> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  DTCORE_CHECK(!hook_, ConfigError,
               "a communication hook is already registered on this model: register_comm_hook (or "
               "_register_builtin_comm_hook) can be called once, as in torch DDP. Fix: register one hook that does "
               "all the work.");
  DTCORE_CHECK(reductions_ == 0 && !backward_started_, ConfigError,
               "register_comm_hook was called after the first backward pass: as in torch DDP, a communication hook "
               "must be registered before the first backward. Fix: register it right after wrapping the model.");
  DTCORE_CHECK(options_.zero == 0, ConfigError, "communication hooks with zero=", options_.zero,
               " are not supported: the reducer reduce-scatters or shards the buckets itself. Fix: wrap with zero=0 "
               "to use a hook.");
  DTCORE_CHECK(!options_.comm_dtype, ConfigError,
               "a communication hook with comm_dtype=", dtype_name(*options_.comm_dtype),
               ": the hook decides what is sent. Fix: wrap with comm_dtype=None and use a compression hook "
               "(torch's fp16_compress_hook or bf16_compress_hook) instead.");
  hook_ = std::move(hook);
}

void Reducer::install_post_backward_futures(std::vector<HookFuture> futures) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& f : futures) {
    DTCORE_CHECK(f, ConfigError,
                 "the buffer communication hook returned a list holding something that is not a future. Fix: "
                 "return a list of torch.futures.Future (or None).");
    post_futures_.push_back(std::move(f));
  }
}

void Reducer::check_joinable() const {
  DTCORE_CHECK(options_.zero == 0, ConfigError, "uneven inputs (join) with zero=", options_.zero,
               " are not supported: every rank's optimizer step gathers every rank's shard. Fix: give every rank the "
               "same number of batches, or wrap with zero=0.");
}

void Reducer::set_divisor(int64_t ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  check_joinable();
  DTCORE_CHECK(ranks >= 1 && ranks <= comm_->size(), ConfigError, "set_divisor(", ranks,
               "): gradients can be averaged over 1 to ", comm_->size(),
               " ranks. Fix: pass the number of ranks that "
               "contributed gradients.");
  DTCORE_CHECK(!hook_ || ranks == comm_->size(), ConfigError,
               "divide_by_initial_world_size=False with a communication hook: the hook averages the gradients "
               "itself. Fix: keep divide_by_initial_world_size=True, or divide inside the hook.");
  divisor_ = ranks;
}

void Reducer::shadow_backward() {
  std::vector<std::shared_ptr<Work>> works;
  std::vector<std::pair<std::string, HookFuture>> futures;
  auto shadow_locked = [&](size_t b) {  // the others' collective (or hook) on this bucket, on zeros
    const Bucket& bucket = plan_[b];
    at::ScalarType dtype = options_.comm_dtype.value_or(bucket.dtype);
    at::Tensor zeros = at::zeros({bucket.numel}, at::TensorOptions().dtype(dtype).device(bucket.device));
    if (hook_) {
      futures.emplace_back(buckets_[b].label, run_hook_locked(b, zeros));
    } else {
      works.push_back(comm_->all_reduce(zeros, ReduceOp::Avg, buckets_[b].label));
    }
  };
  bool mapped = false;  // the others' used map, with find_unused_parameters: this rank used nothing
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_joinable();
    DTCORE_CHECK(!backward_started_, ConfigError, "shadow_backward() during a backward pass on rank ", comm_->rank(),
                 ". Fix: a joined rank runs no backward of its own.");
    for (size_t b = 0; b < plan_.size(); ++b) {
      if (!buckets_[b].skip) shadow_locked(b);  // See Note [Skipped buckets]
    }
    mapped = options_.find_unused_parameters;
    if (mapped) start_used_map_locked(std::vector<float>(slots_.size(), 0.0f));
  }
  std::vector<float> sums;
  if (mapped) {  // the skipped buckets the others reduce late, in the same order
    sums = summed_used_map();
    std::lock_guard<std::mutex> lock(mu_);
    used_work_.reset();  // this rank runs no backward of its own (checked above): nothing else waits on it
    for (size_t b : skipped_but_used_locked(sums)) shadow_locked(b);
  }
  for (auto& w : works) w->wait();
  for (auto& [label, f] : futures) {
    wait_hook_future(f, comm_->timeout(), "the communication hook's future for " + label, comm_->rank());
  }
  bool final_plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_plan = plan_final_;
  }
  if (!final_plan) rebuild_if_needed();  // as the others do at the end of their first reduced backward
  std::lock_guard<std::mutex> lock(mu_);
  plan_skips_locked(sums);  // as the others plan theirs
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

void Reducer::drain_locked(size_t keep) {
  while (drained_ < next_bucket_) {
    BucketState& b = buckets_[drained_];
    if (next_bucket_ - drained_ <= keep && !b.work->is_completed()) return;
    try {
      b.work->wait_on_stream();  // on GPU the allocator reuses the bucket in stream order
    } catch (...) {
      reset_locked();  // this backward ends with the error; the next starts clean
      throw;
    }
    if (b.received.is_same(b.grad_shard)) {
      b.shard_is_zero = false;
    } else {
      b.grad_shard.add_(b.received);  // accumulates, as .grad does, until zero_grad()
    }
    b.work.reset();
    b.received = at::Tensor();
    b.sent = at::Tensor();
    b.buffer = at::Tensor();
    ++drained_;
  }
}

void Reducer::stage_grad_locked(Slot& s) {
  BucketState& b = buckets_[s.bucket];
  if (!b.buffer.defined()) {  // the bucket's first gradient in this backward
    const Bucket& plan = plan_[s.bucket];
    drain_locked(plan.device.is_cuda() ? kShardedInFlightOnGpu : kShardedInFlight);
    b.buffer = at::empty({shards_[s.bucket].padded_numel}, at::TensorOptions().dtype(plan.dtype).device(plan.device));
    b.buffer.narrow(0, plan.numel, b.buffer.numel() - plan.numel).zero_();  // the padding
  }
  at::Tensor place = b.buffer.narrow(0, s.offset, s.param.numel()).view(s.param.sizes());
  const at::Tensor& grad = s.param.grad();
  if (grad.defined()) {
    place.copy_(grad);
  } else {
    place.zero_();
  }
  s.param.mutable_grad() = at::Tensor();  // released: this rank keeps only its shard
}

void Reducer::mark_ready_locked(size_t index) {
  Slot& s = slots_[index];
  if (s.ready) reset_locked();  // the error below ends this backward; the next starts clean
  DTCORE_CHECK(!s.ready, CommError, "parameter '", s.name,
               "' received a second gradient in one backward pass on "
               "rank ",
               comm_->rank(),
               ", so its reduction has already started. Fix: use each parameter once per "
               "backward, or accumulate over several backward passes inside no_sync() before the one that reduces. "
               "With find_unused_parameters or static_graph, checkpointing with use_reentrant=True hides the "
               "parameters inside a checkpointed block from the graph search (they count as unused, then get "
               "gradients): use use_reentrant=False, as dtcore.checkpoint_activations does.");
  s.ready = true;
  if (!s.used) s.grad_was_none = !s.param.grad().defined();  // marked by find_unused(), not by a gradient
  if (!plan_final_) {
    ready_order_.push_back(index);
    if (options_.auto_buckets) {  // See Note [Buckets that size themselves]
      ready_times_.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count());
      if (s.param.is_cuda()) {  // the host runs ahead of the GPU: its clock, at this point of its stream
        ready_events_.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
        ready_events_.back().record(c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(s.param.device()));
      }
    }
  }
  grad_order_.push_back(index);
  if (sharded_grads_) {
    stage_grad_locked(s);
  } else {
    adopt_grad_locked(s);
  }
  if (--buckets_[s.bucket].pending == 0) launch_ready_locked();
}

void Reducer::lend_view(size_t index, bool defined) {
  if (!defined) return;                    // nothing comes: See Note [Outputs the loss does not use]
  if (at::GradMode::is_enabled()) return;  // create_graph=True: on_grad_ready() refuses it
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[index];
  if (s.param.grad().defined()) return;  // a view already, or a tensor the post-hook copies in
  s.view.zero_();
  s.param.mutable_grad() = s.view;
}

void Reducer::on_grad_ready(size_t index, bool defined) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slots_[index].accumulator->post_hooks().size() > 1) {  // See Note [One reducer per parameter]
    reset_locked();
    DTCORE_CHECK(false, ConfigError, "parameter '", slots_[index].name,
                 "' got another reducer's gradient hook after dtcore wrapped it (torch.nn.parallel."
                 "DistributedDataParallel or FSDP built over the module dtcore wrapped): two gradient reducers write "
                 "its .grad during backward, so this step's gradients are wrong. Fix: use one data-parallel wrapper: "
                 "train through the dtcore model alone and drop the torch one.");
  }
  if (at::GradMode::is_enabled()) {  // backward(create_graph=True): .grad is being replaced out of place
    reset_locked();
    DTCORE_CHECK(false, ConfigError,
                 "backward(create_graph=True) through a wrapped model is not supported: its "
                 "gradients would be averaged without their graph. Fix: compute higher-order gradients on the "
                 "unwrapped module (model.module), or average them yourself with dtcore.all_reduce.");
  }
  Slot& s = slots_[index];
  if (!expect_hooks_) {    // no_sync, or a backward the wrapper's forward did not prepare
    if (!defined) return;  // nothing came: .grad stays as it is, as without a wrapper
    s.used_unsynced = true;
    if (!sharded_grads_) adopt_grad_locked(s);  // zero=2: .grad stays autograd's, full
    return;
  }
  if (!backward_started_) {
    backward_started_ = true;
    times_ = BackwardTimes{};
    grad_order_.clear();
    buckets_reduced_ = 0;
    for (size_t u : unused_) mark_ready_locked(u);  // see find_unused()
  }
  if (static_recorded_ && s.static_unused) {  // See Note [Static graph]: marked ready when backward started
    if (!defined) return;
    // The backward's state stays for the next forward's report, which drains it.
    DTCORE_CHECK(false, ConfigError,
                 "Your training graph has changed in this iteration, e.g., one parameter is unused in first "
                 "iteration, but then got used in the second iteration. this is not compatible with static_graph "
                 "set to True. Parameter '",
                 s.name, "' (index ", index, ") got a gradient on rank ", comm_->rank(),
                 " but got none in the first backward. Fix: use the same parameters in every step with "
                 "static_graph=True, or wrap with find_unused_parameters=True instead.");
  }
  s.used = defined;  // an undefined gradient readies it without using it: Note [Outputs the loss does not use]
  mark_ready_locked(index);
}

void Reducer::finalize() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<BucketState*> launched;
  for (auto& b : buckets_) launched.push_back(&b);
  const bool mapped = used_work_ != nullptr;  // else every parameter got a gradient
  lock.unlock();
  // Waited without the lock: no hook of the next backward can run before this returns.
  std::exception_ptr failure;
  std::vector<float> used_sums;  // with `mapped`: how many ranks used each parameter
  if (mapped) {
    try {
      used_sums = summed_used_map();
      reduce_skipped_if_used(used_sums);  // See Note [Skipped buckets]
    } catch (...) {
      failure = std::current_exception();
    }
  }
  for (BucketState* b : launched) {
    try {
      if (b->work) b->work->wait_on_stream();  // See Note [Waiting on the stream]
      if (b->future) {
        wait_hook_future(b->future, comm_->timeout(), "the communication hook's future for " + b->label, comm_->rank());
        at::Tensor result = hook_result(*hook_, b->future, b->buffer.numel(), b->label);
        if (!result.is_same(b->buffer)) b->buffer.copy_(result);
      } else if (b->received.defined() && b->received.is_same(b->grad_shard)) {
        b->shard_is_zero = false;
      } else if (b->received.defined()) {
        b->grad_shard.add_(b->received);  // accumulates, as .grad does, until zero_grad()
      } else if (b->sent.defined()) {
        b->buffer.copy_(b->sent);  // back into the parameters' dtype
      }
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (!failure && mapped) restore_globally_unused(used_sums);
  if (!failure) {
    std::lock_guard<std::mutex> relock(mu_);
    if (options_.static_graph && !static_recorded_) {  // before a rebuild resets `used`: See Note [Static graph]
      for (Slot& s : slots_) s.static_unused = !s.used;
      static_recorded_ = true;
    }
  }
  std::vector<HookFuture> post_futures;
  int64_t divisor;
  {
    std::lock_guard<std::mutex> relock(mu_);
    post_futures = post_futures_;
    divisor = divisor_;
  }
  for (size_t i = 0; i < post_futures.size() && !failure; ++i) {
    try {
      wait_hook_future(post_futures[i], comm_->timeout(),
                       detail::cat("the buffer communication hook's future ", i + 1, "/", post_futures.size()),
                       comm_->rank());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (!failure && divisor > 0 && divisor != comm_->size()) {  // averaged over the world: over `divisor` ranks instead
    const double scale = static_cast<double>(comm_->size()) / static_cast<double>(divisor);
    for (BucketState* b : launched) {
      if (b->work || b->future) b->buffer.mul_(scale);  // a skipped bucket holds no average
    }
  }
  if (!failure && !plan_final_) {
    try {
      rebuild_if_needed();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  lock.lock();
  // From the summed map, the same on every rank, even where a later, rank-local step failed (a hook's
  // future): a rank that goes on must skip what the others skip. See Note [Skipped buckets].
  if (!failure || !used_sums.empty()) plan_skips_locked(used_sums);
  if (!failure) last_buckets_reduced_ = buckets_reduced_;
  reset_locked();
  if (failure) std::rethrow_exception(failure);
  for (Slot& s : slots_) {
    if (!mapped) s.without_grad = false;
    s.used_unsynced = false;
  }
  if (options_.zero == 2 && plan_final_ && !sharded_grads_) shard_gradients_locked();
  ++reductions_;
}

void Reducer::raise(std::exception_ptr error) const {
  {
    auto [kind, message] = describe_error(error);
    std::lock_guard<std::mutex> lock(error_mu_);
    last_error_ = ErrorRecord{last_error_.count + 1, std::move(kind), std::move(message)};
  }
  if (rethrow_) rethrow_(error);
  std::rethrow_exception(error);  // also when rethrow_ returned, which it must not
}

}  // namespace dtcore
