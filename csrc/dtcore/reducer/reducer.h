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
// Note [Unused parameters keep None]: as in torch DDP, .grad stays None until a parameter gets a
// gradient (zero=0), and with find_unused_parameters a parameter that no rank used in a backward
// keeps the None it had: a used map (one element per gradient) is summed across ranks after the
// last bucket, and finalize() releases the zero view it was reduced with. Otherwise optimizers
// with momentum or weight decay would update parameters torch DDP leaves alone. Under ZeRO no
// .grad is handed to the optimizer, so the reducer keeps the same fact for the sharded one:
// params_without_grad() lists the parameters whose .grad torch DDP would hold as None (no rank
// gave them a gradient, in a synced backward or in a no_sync one before it, since the last
// zero_grad(set_to_none=True) or since wrapping), and ShardedOptimizer skips their pieces. The
// used map is reduced for that with zero=2 too.
//
// Note [Outputs the loss does not use]: with find_unused_parameters, the graph search counts a
// parameter as used when any output reaches it, but autograd runs only what the loss reaches: a
// parameter behind an output the loss ignores (an auxiliary head, an entry of a dict kept for
// logging) would never get its hook, and its bucket would never start. As torch DDP's _DDPSink, the
// wrapper's forward passes the outputs that need a gradient through one autograd function whose
// backward hands on what it gets, None included (python/dtcore/reducer/outputs.py): once the loss
// reaches any output, autograd runs every output's graph, and the hooks of parameters behind the
// unused ones fire with an undefined gradient. Such a hook marks the parameter ready without
// counting it as used, so it keeps its None where no rank gave it a gradient (Note [Unused
// parameters keep None]); the pre-hook lends it no view. An undefined gradient never becomes zeros
// in .grad by itself, in any backward: only the average of other ranks' gradients is written.
//
// Note [Static graph]: static_graph=True promises that every step uses the same parameters. The
// first reduced backward searches the graph as find_unused_parameters does and records, on each
// rank, which parameters got no gradient; later forwards need no search (those are marked ready
// when the backward starts) and no output function. A graph that changes is an error with torch's
// words, naming the parameter: a recorded-unused parameter that gets a gradient raises inside the
// backward, and a recorded-used one that gets none leaves the reduction unfinished, which the next
// forward reports. Either way the backward's state is kept for that report, which then drains it.
// Like find_unused_parameters, the first backward's search cannot see the parameters inside a block
// checkpointed with use_reentrant=True (its node hides them until its nested backward): they count
// as unused, then get gradients, which is refused. torch's static graph counts hook calls instead;
// dtcore.checkpoint_activations uses use_reentrant=False, which the search sees through.
//
// Note [Skipped buckets]: with skip_all_reduce_unused_params, a bucket none of whose parameters any
// rank used in the last reduced backward (the summed used map says so on every rank alike) is not
// reduced in the next one: ranks decide from the same numbers, so their collectives still pair up,
// whatever each rank's graph. If the used map of that backward shows a rank used one of them after
// all, every rank reduces the bucket at the end of the backward, before .grad is read: late, never
// wrong, never a hang (torch's variant decides per rank and hangs when ranks differ).
//
// Note [Lent bucket views]: with zero=0, a pre-hook on each parameter's AccumulateGrad node runs
// just before autograd accumulates the parameter's gradient. If .grad is None there
// (optimizer.zero_grad(set_to_none=True), torch's default), it becomes the parameter's bucket view,
// zeroed, so autograd adds into the bucket in place: no fresh gradient is kept, and the post-hook
// has nothing to copy. Only a parameter that is getting a gradient is lent its view, in any
// backward (synced, no_sync, or one the wrapper's forward did not prepare), so a parameter no
// backward reaches keeps its None (Note [Unused parameters keep None]) and nothing changes between
// the forward and the backward. This is what the post-hook would otherwise do after the fact
// (copy the new gradient into the view and point .grad at it), done before. If .grad was replaced
// by another tensor (a user assignment), autograd accumulates into that one, and the post-hook
// copies it into the bucket and points .grad back at the view. zero >= 1 lends nothing: .grad is
// the view already (zero=1) or is released (zero=2).
// Only CPU parameters are lent views. On a GPU, zeroing the view and adding into it are three
// passes over the gradient's memory where the post-hook's copy of the fresh gradient is two, and
// the caching allocator makes the fresh gradient free: on an H100 the copy took dtcore's step from
// 1.023x to 1.014x a plain loop's for GPT-2 124M, and from 1.045x to 1.029x for 350M
// (docs/benchmarks.md, GPU figures).
//
// ZeRO (Options::zero, see Note [Shard layout]): buckets are padded so that every rank owns an
// equal shard of each. zero=1 reduces as above (allreduce, full gradients on every rank); the
// sharded optimizer reads only this rank's shard of each bucket (grad_shard()). zero=2 keeps only
// the shard: from the second backward on (once the plan is final), each gradient is copied into
// a bucket buffer that exists only while its bucket is in flight, .grad is released, and a full
// bucket is reduce-scattered, its average added into this rank's persistent gradient shard. After
// such a backward every .grad is None and the gradients live in grad_shard(); the first backward
// allreduces as zero=1 does and its result is cut to the shard when the plan becomes final.
// Inside no_sync() zero=2 leaves .grad to autograd (full, local); the next synced backward
// reduces the sum.
//
// Note [Buckets in flight]: a zero=2 bucket buffer exists from the bucket's first gradient until
// its reduce-scatter has finished and been added into the shard; then it is freed, not at the end
// of backward. Before a new bucket buffer is allocated, the launched buckets are waited for while
// more than kShardedInFlight of them are unfinished (finished ones are drained at every launch
// without waiting). kShardedInFlight is 0: during backward a rank holds one bucket buffer at a
// time (the one in flight, or the one filling), not the whole gradient: that is the "bucket in
// flight" term of stage 2's memory, 4 Psi + 12 Psi / N + the largest bucket. The price is overlap:
// a bucket's reduce-scatter runs beside the backward only until the next bucket's first gradient.
// With 1 (one in flight while the next fills), a rank holds two buckets, which at 2 ranks and
// 25 MiB buckets is more than stage 2 saves over ZeroRedundancyOptimizer + DDP; the step time the
// overlap bought was within the run-to-run noise on Gloo (docs/benchmarks.md, ZeRO).
// On a GPU it is 1 (kShardedInFlightOnGpu): there the wait orders streams (Note [Waiting on the
// stream]), so with 0 the backward's stream would wait for each reduce-scatter just launched,
// and communication would no longer overlap compute at all; with 1 it waits for the one before,
// and the caching allocator hands the freed bucket out again in stream order.
//
// Communication hooks and uneven inputs (torch's Join): see Note [Communication hooks]
// (comm_hook.h). A rank that ran out of data shadows the others' synced backward with
// shadow_backward(): each bucket's collective (or hook) on zeros, in plan order, so that every
// collective still pairs up; set_divisor() averages over the ranks that still have data.
//
// Note [One reducer per parameter]: each parameter's AccumulateGrad node carries dtcore's post-hook
// and no other. torch DDP's and FSDP's reducers hook the same node, and two reducers writing one
// .grad give wrong gradients, so a hook already there is a ConfigError at construction, and one
// added later (torch DDP built over the module dtcore wrapped) at the next backward, before the
// step. The Python side names a dtcore wrapper first (python/dtcore/reducer/stacking.py). A second
// dtcore wrapper of the same parameters takes them over, as torch allows a module to be wrapped
// again: the earlier wrapper's reducer removes its hooks (release_parameters()) before the new one
// adds its own, and the earlier wrapper refuses any further forward or backward, saying it was
// replaced. Only dtcore's own wrappers are taken over: a foreign hook is still refused.
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
#include <c10/core/Event.h>
#include <c10/util/intrusive_ptr.h>

#include "dtcore/comm/communicator.h"
#include "dtcore/reducer/bucket_plan.h"
#include "dtcore/reducer/comm_hook.h"
#include "dtcore/reducer/shard_plan.h"

#include <torch/headeronly/version.h>

namespace torch::autograd {
struct Node;
struct FunctionPreHook;
}  // namespace torch::autograd

namespace dtcore::detail {
// What torch holds an autograd node by (grad_accumulator() returns it): c10::intrusive_ptr from
// torch 2.13 on, std::shared_ptr before. reducer.cpp checks this guess against the real return type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
using NodePtr = c10::intrusive_ptr<torch::autograd::Node>;
#else
using NodePtr = std::shared_ptr<torch::autograd::Node>;
#endif
}  // namespace dtcore::detail

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
    // ZeRO stage: 0 (every rank keeps whole gradients), 1 (the optimizer keeps this rank's shard:
    // buckets padded, see Note [Shard layout]) or 2 (gradients sharded too). ConfigError otherwise.
    int zero = 0;
    // torch DDP's static_graph: the parameters used in each step are those of the first reduced
    // backward; later steps need no graph search, and a graph that changes is an error. See
    // Note [Static graph]. Turns find_unused_parameters on.
    bool static_graph = false;
    // torch DDP's skip_all_reduce_unused_params: a bucket none of whose parameters any rank used in
    // the last reduced backward is not reduced. Needs find_unused_parameters (or static_graph) and
    // zero=0. See Note [Skipped buckets].
    bool skip_all_reduce_unused_params = false;
    // bucket_mb="auto": the first reduced backward's timeline and the measured cost of an all-reduce
    // choose the buckets (Note [Buckets that size themselves] in bucket_plan.h); bucket_mb and
    // first_bucket_mb then shape only the first plan, and first_bucket_mb must be left at its default.
    bool auto_buckets = false;
  };

  // ConfigError naming the first option that cannot be honoured, with the fix; the constructor
  // checks them so first. A wrapper checks them before it takes parameters over from another.
  static void check_options(const Options& options);

  // `params` in registration order, with `names` for messages; parameters that do not require
  // grad are skipped. ConfigError for bad options (check_options), sparse parameters or
  // parameters that are not leaves.
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

  // Turns find_unused_parameters on or off for the coming backward passes. ConfigError during a
  // backward.
  void set_find_unused_parameters(bool on);
  bool find_unused_parameters() const;
  // torch DDP's _set_static_graph(): Options::static_graph after construction, before the first
  // reduced backward (ConfigError after it). See Note [Static graph].
  void set_static_graph();
  bool static_graph() const;
  // True once static_graph has recorded the parameters each step uses: forwards need neither the
  // graph search nor the output function (Note [Outputs the loss does not use]) any more.
  bool static_graph_recorded() const;

  // How an error raised inside backward (a hook, or the final wait) leaves autograd. By default it
  // is rethrown as is, and autograd's Python face turns any C++ exception into RuntimeError; the
  // Python binding installs one that keeps the error's class (CommError, ConfigError), so that
  // `except dtcore.CommError` works around loss.backward(). Set before the first backward.
  using Rethrow = std::function<void(std::exception_ptr)>;
  void set_rethrow(Rethrow rethrow) { rethrow_ = std::move(rethrow); }

  // See Note [Communication hooks]. Before the first backward, once; with zero=0 and no comm_dtype
  // (the hook decides what is sent). ConfigError otherwise.
  void register_comm_hook(std::unique_ptr<CommHook> hook);
  // Futures the coming backward waits for (with the timeout) before it ends: torch DDP's buffer
  // hook's. Dropped by the next prepare_for_backward() if no reduced backward follows.
  void install_post_backward_futures(std::vector<HookFuture> futures);
  // The coming backward divides the gradients' sum by `ranks` instead of the world size (torch's
  // Join with divide_by_initial_world_size=False); not with a hook, which averages itself. Set
  // after prepare_for_backward(); ConfigError unless 1 <= ranks <= world size.
  void set_divisor(int64_t ranks);
  // A joined rank's side of the others' synced backward: every bucket's collective (or hook) on
  // zeros, in plan order, waited with the timeout, then the bucket rebuild if the others do theirs.
  // This rank's gradients are left as they are. ConfigError with zero > 0 or during a backward.
  void shadow_backward();
  // ConfigError unless uneven inputs can be shadowed (zero=0).
  void check_joinable() const;

  // See Note [One reducer per parameter]: a newer wrapper takes these parameters over (or torch
  // DDP's _remove_autograd_hooks()). Removes this reducer's hooks (as the destructor does) so that
  // the newer reducer's can be added; the wrapper refuses any further use of this one. A backward
  // that started reducing and did not complete (it raised) is drained first, as by
  // prepare_for_backward().
  void release_parameters();

  const std::vector<Bucket>& buckets() const { return plan_; }
  // Backward passes fully reduced so far.
  int64_t reductions() const;
  // Buckets whose collective (or hook) ran in the last reduced backward: fewer than buckets() when
  // some were skipped (Note [Skipped buckets]). torch's logging data's num_buckets_reduced.
  int64_t last_buckets_reduced() const;
  // True once the buckets were rebuilt in the order gradients became ready (torch's
  // has_rebuilt_buckets): after the first reduced backward, unless find_unused_parameters without
  // static_graph keeps the first plan's order, as torch DDP does, since a graph that changes
  // changes that order too.
  bool order_rebuilt() const;
  // The last error raised inside a backward (a hook or the final wait), which reaches only the
  // caller of backward(): how many there were so far, its class's name and its message. torch DDP's
  // logging data records it (python/dtcore/reducer/logging_data.py).
  struct ErrorRecord {
    int64_t count = 0;
    std::string kind;
    std::string message;
  };
  ErrorRecord last_backward_error() const;

  // Note [Backward timeline]: what torch DDP's logging data reports of a backward, for the last
  // synced backward, on the host clock in nanoseconds since the epoch (Python's time.time_ns()):
  // when the first bucket's collective started, when the last gradient was ready (the last bucket
  // starts then) and when the reduction was complete (finalize() returned); 0 for an event that
  // backward did not reach. The wrapper adds the forward's times and samples them as torch does
  // (python/dtcore/reducer/logging_data.py).
  struct BackwardTimes {
    int64_t comm_start_ns = 0;
    int64_t compute_end_ns = 0;
    int64_t comm_end_ns = 0;
  };
  BackwardTimes last_backward_times() const;
  // With Options::auto_buckets, once the plan is final: what it was chosen from and what it expects
  // (all 0 before, or where the first plan was kept: find_unused_parameters without static_graph).
  struct AutoPlanInfo {
    bool chosen = false;        // the plan is the auto planner's
    bool device_clock = false;  // the timeline is the GPU's (CUDA events), not the host's
    double alpha_us = 0;        // one all-reduce: alpha_us + us_per_mib x MiB (rank 0's fit)
    double us_per_mib = 0;
    double backward_ms = 0;         // the first reduced backward, first gradient to last (rank 0)
    double exposed_ms = 0;          // communication left after the last gradient, by that model
    double default_exposed_ms = 0;  // the same for the default caps' plan in the same order
  };
  AutoPlanInfo auto_plan_info() const;
  // Builds these buckets (registration indices of trainable parameters, as bucket_params() lists
  // them) as the final plan, as a resumed job's checkpoint keeps it: before the first reduction,
  // on every rank alike (a collective where the buckets go into shared memory). ConfigError when
  // the plan is already final or `buckets` is not a partition of the parameters into buckets of one
  // device and dtype.
  void adopt_plan(const std::vector<std::vector<size_t>>& buckets);

  // The parameters (as in Bucket::params) in the order they were marked ready in the last reduced
  // backward; parameters find_unused() found unused come first.
  std::vector<size_t> last_ready_order() const;

  // --- ZeRO (zero >= 1): the sharded optimizer's view. Not during a backward. ---
  int zero() const { return options_.zero; }
  // True once the buckets will not be rebuilt again (after the first reduced backward); per-shard
  // state must be built on the final plan (Note [Shard layout]). plan_version() counts rebuilds.
  bool plan_final() const;
  int64_t plan_version() const;
  std::vector<BucketShard> shards() const;  // this rank's shard of each bucket, as buckets()
  // This rank's reduced gradient shard of every bucket (shard_numel elements of the bucket's
  // dtype): views of the bucket buffers (zero=1, and zero=2 before the plan is final) or the
  // persistent shards (zero=2). ConfigError when zero == 0.
  std::vector<at::Tensor> grad_shards() const;
  // Zeroes the gradients in place and keeps them where the reducer wants them: .grad the bucket
  // views again (zero <= 1), or the shards zeroed and any local .grad released (zero=2).
  // `set_to_none` is torch's: true makes every parameter count as holding no gradient until one
  // comes (params_without_grad()); false leaves zeros, which an optimizer steps. ConfigError
  // during a backward.
  void zero_grad(bool set_to_none = true);
  // Registration indices (as in Bucket::params) of the parameters torch DDP would leave with
  // .grad None: See Note [Unused parameters keep None]. Always empty after a reduced backward
  // without find_unused_parameters (every parameter got a gradient).
  std::vector<size_t> params_without_grad() const;

 private:
  struct Slot {
    at::Tensor param;
    std::string name;
    size_t bucket = 0;
    at::Tensor view;              // the parameter's place in its bucket, shaped like the parameter; none once sharded
    int64_t offset = 0;           // its first element in the bucket, see Note [Bucket layout]
    detail::NodePtr accumulator;  // kept alive: autograd holds it weakly
    uintptr_t hook_key = 0;
    const torch::autograd::FunctionPreHook* lend_hook = nullptr;  // zero=0; See Note [Lent bucket views]
    bool ready = false;                                           // in the current backward
    bool used = false;           // got a gradient from autograd in the current backward (not only find_unused's mark)
    bool grad_was_none = false;  // marked unused while .grad was None: None again if unused on every rank
    bool used_unsynced = false;  // got a gradient in a no_sync backward since the last reduced one
    bool without_grad = true;    // no rank gave it one since zero_grad(set_to_none=True): params_without_grad()
    bool static_unused = false;  // static_graph: got no gradient in the first reduced backward, on this rank
  };
  struct BucketState {
    at::Tensor buffer;
    std::string label;   // "bucket 3/8", its name in the flight recorder; made with the plan
    size_t pending = 0;  // gradients not yet ready in the current backward
    std::shared_ptr<Work> work;
    at::Tensor sent;             // with comm_dtype: the buffer cast for the collective, copied back at the end
    at::Tensor grad_shard;       // zero=2 once sharded: this rank's reduced gradient, kept across steps
    bool shard_is_zero = false;  // grad_shard holds zeros (zero_grad()): the reduce-scatter writes it directly
    at::Tensor received;         // zero=2, accumulating: the reduce-scatter's output, added into grad_shard
    HookFuture future;           // with a comm hook: its result, copied into buffer at the end
    bool skip = false;           // not reduced in the coming backward: See Note [Skipped buckets]
  };

  void lend_view(size_t slot, bool defined);      // autograd pre-hook; See Note [Lent bucket views]
  void on_grad_ready(size_t slot, bool defined);  // autograd post-hook, on an engine thread; `defined`: a gradient came
  void finalize();                                // queued with the engine when the last bucket starts
  [[noreturn]] void raise(std::exception_ptr error) const;  // through rethrow_
  void reset_locked();
  // With `lock` held on entry and return: waits (unlocked, with the timeout) for the collectives and
  // hook futures an unfinished backward launched, then resets.
  void drain_unfinished(std::unique_lock<std::mutex>& lock);
  void remove_hooks_locked();              // the destructor's and release_parameters()'s
  void launch_ready_locked();              // starts buckets next_bucket_, ... while they are complete
  void start_bucket_locked(size_t index);  // its collective (or hook), overlapping the rest of backward
  // The used map's all-reduce (1 per parameter this rank used: a joined rank sends zeros), and its
  // sum, waited for with the timeout; see Note [Unused parameters keep None].
  void start_used_map_locked(const std::vector<float>& used);
  std::vector<float> summed_used_map();
  void restore_globally_unused(const std::vector<float>& sums);  // ditto
  // The skipped buckets some rank used after all (by the used map's `sums`), reduced now: See Note
  // [Skipped buckets]. skipped_but_used_locked() lists them, for a joined rank's shadow too.
  void reduce_skipped_if_used(const std::vector<float>& sums);
  std::vector<size_t> skipped_but_used_locked(const std::vector<float>& sums) const;
  void plan_skips_locked(const std::vector<float>& sums);  // the coming backward's skips, from this one's sums
  HookFuture run_hook_locked(size_t bucket, const at::Tensor& contents);  // the hook on a bucket's contents
  void adopt_grad_locked(Slot& s);  // makes s.param.grad the bucket view again, keeping its value
  void stage_grad_locked(Slot& s);  // zero=2: s.param.grad into its in-flight bucket, then released
  void drain_locked(size_t keep);   // zero=2: finished buckets into their shards; see Note [Buckets in flight]
  void shard_gradients_locked();    // zero=2, once the plan is final: keep only this rank's shards
  void mark_ready_locked(size_t slot);
  // Allocates `plan`'s buckets (in a shared buffer if `shared_memory`: See Note [Buckets in shared memory]),
  // points grads at views; takes mu_. With `only_into_shared_memory`, keeps the buckets as they
  // are when the buffer cannot be had, and says so: false.
  bool build_buckets(std::vector<Bucket> plan, bool shared_memory, bool only_into_shared_memory);
  std::vector<Bucket> first_plan() const;  // before any backward is observed: See Note [The first plan]
  void rebuild_if_needed();                // after the first reduction: buckets in the order observed on rank 0
  // One all-reduce's cost on this communicator, on buffers like the final plan's: a collective.
  CollectiveCost measure_collective_cost(bool shared_memory);
  bool shared_memory_plan() const;  // whether the final plan's buckets go into shared memory

  std::shared_ptr<Communicator> comm_;
  Options options_;
  std::unique_ptr<CommHook> hook_;  // replaces the buckets' all_reduce; See Note [Communication hooks]
  Rethrow rethrow_;
  BucketCaps caps_;  // options_'s caps in bytes
  std::vector<GradSpec> specs_;
  std::vector<Bucket> plan_;
  std::vector<Slot> slots_;  // indexed like plan_'s parameter indices
  std::vector<BucketState> buckets_;
  std::vector<BucketShard> shards_;  // zero >= 1: this rank's shard of each bucket
  int64_t plan_version_ = 0;         // build_buckets() calls
  bool buckets_shared_ = false;      // the buckets are in a shared buffer: See Note [Buckets in shared memory]

  mutable std::mutex mu_;
  bool expect_hooks_ = false;             // armed by prepare_for_backward(sync=true), cleared at the end
  bool backward_started_ = false;         // a hook of the armed backward has run
  std::vector<size_t> unused_;            // found by find_unused(), marked ready by the first hook
  at::Tensor used_map_;                   // with find_unused_parameters: 1 per slot used on this rank, then summed
  std::shared_ptr<Work> used_work_;       // the used map's allreduce, after the last bucket's
  std::vector<HookFuture> post_futures_;  // install_post_backward_futures(), waited in finalize()
  int64_t divisor_ = 0;                   // set_divisor(); 0: the world size
  size_t next_bucket_ = 0;                // the next bucket to launch, in plan order
  size_t drained_ = 0;                    // zero=2: buckets before this one are in their shards, buffers freed
  std::vector<size_t> ready_order_;       // slots in the order they became ready (until the rebuild)
  std::vector<int64_t> ready_times_;      // when each became ready (steady clock, ns), with auto_buckets
  std::vector<c10::Event> ready_events_;  // and on CUDA, where it became ready on the device's stream
  AutoPlanInfo auto_info_;
  std::vector<size_t> grad_order_;  // the same in every reduced backward, kept after it; last_ready_order()
  BackwardTimes times_;             // See Note [Backward timeline]; cleared when a backward starts
  bool plan_final_ = false;         // the one rebuild was tried: buckets stay as they are
  bool sharded_grads_ = false;      // zero=2 after shard_gradients_locked()
  bool static_recorded_ = false;    // See Note [Static graph]: Slot::static_unused is set
  bool order_rebuilt_ = false;      // order_rebuilt()
  int64_t reductions_ = 0;
  int64_t buckets_reduced_ = 0;  // in the backward so far; last_buckets_reduced() once it is reduced
  int64_t last_buckets_reduced_ = 0;

  mutable std::mutex error_mu_;  // last_error_ alone: raise() runs with or without mu_
  mutable ErrorRecord last_error_;
};

}  // namespace dtcore
