// Reducer: every rank holds the average gradient after backward, with communication running
// while backward is still computing.
//
// On construction the gradients are planned into buckets (bucket_plan.h) and each parameter's
// .grad becomes a view into its bucket's flat buffer (see Note [Bucket layout]), so autograd
// accumulates straight into the buffer and no copy is made. A post-hook on each parameter's
// AccumulateGrad node marks its gradient ready; when a bucket's last gradient is ready, the
// bucket's asynchronous allreduce (average) starts, on the communicator (Gloo's
// threads on CPU, the NCCL stream on GPU) while autograd goes on with earlier layers. Buckets
// start strictly in plan order (a ready bucket waits for the earlier ones): collectives must be
// issued in the same order on every rank, whatever order autograd happens to run in. When the
// last bucket starts, a callback is queued with the autograd engine; it runs when backward ends,
// waits for every bucket (with the communicator's timeout) and resets for the next pass.
//
// As in torch DDP, the forward decides: prepare_for_backward() arms the hooks for the coming
// backward only when the wrapper's forward ran with grad enabled and sync on. Otherwise the hooks
// only keep gradients in the bucket views (no_sync accumulation, or a backward that does not go
// through the wrapper). A backward whose reduction did not complete (a parameter got no gradient,
// or the backward raised) is reported by the next prepare_for_backward(), by parameter name.
//
// If a .grad was replaced (e.g. optimizer.zero_grad(set_to_none=True) left None and autograd
// allocated a new tensor), the hook copies it into the bucket and points .grad back at the view.
//
// Ownership: holds the parameters, the bucket buffers and the communicator; removes its hooks
// on destruction. Thread safety: hooks may run on autograd worker threads; all state is guarded
// by one mutex. One backward at a time per Reducer.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "dtcore/comm/communicator.h"
#include "dtcore/reducer/bucket_plan.h"

namespace torch::autograd {
struct Node;
}

namespace dtcore {

class Reducer {
 public:
  struct Options {
    // Bucket caps in MiB (2^20 bytes): the first bucket's small, so communication starts early.
    double bucket_mb = kDefaultBucketMiB;
    double first_bucket_mb = kDefaultFirstBucketMiB;
    // Allow parameters that get no gradient: find them after each forward by walking the graph
    // from its outputs (find_unused()), and reduce them with their local gradient (zero if none).
    bool find_unused_parameters = false;
    // Send gradients in this dtype (bfloat16, float16 or float32) and accumulate the result back
    // in the parameter's; nullopt sends them as they are. ConfigError for another dtype.
    std::optional<c10::ScalarType> comm_dtype;
  };

  // `params` in registration order, with `names` for messages; parameters that do not require
  // grad are skipped. ConfigError for sparse parameters or parameters that are not leaves.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<Communicator> comm,
          Options options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called by the wrapper's forward when grad is enabled: the coming backward reduces when `sync`
  // (false inside no_sync()). If the previous backward started reducing but did not complete,
  // drains its collectives and raises ConfigError naming the parameters that got no gradient.
  void prepare_for_backward(bool sync);

  // With find_unused_parameters: called with the forward's outputs; every parameter the graph
  // does not reach is marked ready when the backward starts (with what it holds locally, zero if
  // nothing). Marked then, not now, so that every rank issues its collectives inside backward.
  void find_unused(const std::vector<at::Tensor>& outputs);

  // How an error raised inside backward (a hook, or the final wait) leaves autograd. By default it
  // is rethrown as is, and autograd's Python face turns any C++ exception into RuntimeError; the
  // Python binding installs one that keeps the error's class (CommError, ConfigError), so that
  // `except dtcore.CommError` works around loss.backward(). Set before the first backward.
  using Rethrow = std::function<void(std::exception_ptr)>;
  void set_rethrow(Rethrow rethrow) { rethrow_ = std::move(rethrow); }

  const std::vector<Bucket>& buckets() const { return plan_; }
  // Backward passes fully reduced so far.
  int64_t reductions() const;

 private:
  struct Slot {
    at::Tensor param;
    std::string name;
    size_t bucket = 0;
    at::Tensor view;  // the parameter's place in its bucket, shaped like the parameter
    c10::intrusive_ptr<torch::autograd::Node> accumulator;  // kept alive: autograd holds it weakly
    uintptr_t hook_key = 0;
    bool ready = false;  // in the current backward
  };
  struct BucketState {
    at::Tensor buffer;
    std::string label;   // "bucket 3/8", its name in the flight recorder; made with the plan
    size_t pending = 0;  // gradients not yet ready in the current backward
    std::shared_ptr<Work> work;
    at::Tensor sent;  // with comm_dtype: the buffer cast for the collective, copied back at the end
  };

  void on_grad_ready(size_t slot);                          // autograd post-hook, on an engine thread
  void finalize();                                          // queued with the engine when the last bucket starts
  [[noreturn]] void raise(std::exception_ptr error) const;  // through rethrow_
  void reset_locked();
  void launch_ready_locked();       // starts buckets next_bucket_, ... while they are complete
  void adopt_grad_locked(Slot& s);  // makes s.param.grad the bucket view again, keeping its value
  void mark_ready_locked(size_t slot);
  void build_buckets(const std::vector<size_t>& order);  // plans, allocates, points grads at views
  void rebuild_if_needed();  // after the first reduction: buckets in the order observed on rank 0

  std::shared_ptr<Communicator> comm_;
  Options options_;
  Rethrow rethrow_;
  BucketCaps caps_;  // options_'s caps in bytes
  std::vector<GradSpec> specs_;
  std::vector<Bucket> plan_;
  std::vector<Slot> slots_;  // indexed like plan_'s parameter indices
  std::vector<BucketState> buckets_;

  mutable std::mutex mu_;
  bool expect_hooks_ = false;        // armed by prepare_for_backward(sync=true), cleared at the end
  bool backward_started_ = false;    // a hook of the armed backward has run
  std::vector<size_t> unused_;       // found by find_unused(), marked ready by the first hook
  size_t next_bucket_ = 0;           // the next bucket to launch, in plan order
  std::vector<size_t> ready_order_;  // slots in the order they became ready (until the rebuild)
  bool rebuilt_ = false;
  int64_t reductions_ = 0;
};

}  // namespace dtcore
