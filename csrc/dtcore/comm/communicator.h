// Communicator: the one interface dtcore's collectives go through, whatever the engine.
//
// Implementations: GlooCommunicator (CPU tensors, the Gloo inside libtorch) and
// NcclCommunicator (CUDA tensors, dtcore's own NCCL communicator, only when built with NCCL).
// Every collective is asynchronous and returns a Work; Work::wait() blocks with a timeout (the
// communicator's unless given) and turns any failure (timeout, dead peer, engine error) into a
// CommError that names the operation, its sequence number and this rank.
//
// The public collectives are written once, here: they check their inputs (ConfigError naming the
// argument and the fix), number the collective, name it for messages, record it with the health
// monitor, and hand it to the engine as one Collective through start(), the only thing an engine
// implements besides close().
//
// Buffers are flat: reduce_scatter and all_gather take one input and one output tensor whose
// sizes differ by the world size, the layout the reducer and ZeRO sharding use.
//
// Thread safety: a Communicator may be called from one thread at a time per process (the
// collectives' order must match across ranks anyway); a Work may be waited on from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtcore/comm/flight_recorder.h"
#include "dtcore/comm/health.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/settings.h"

namespace dtcore {

enum class ReduceOp { Sum, Avg, Max, Min };

// Parses "sum" | "avg" (or "mean") | "max" | "min", in any case; ConfigError otherwise.
ReduceOp parse_reduce_op(std::string_view text);
std::string_view reduce_op_name(ReduceOp op);

enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier };

std::string_view collective_name(CollectiveKind kind);  // "all_reduce", "reduce_scatter", ...

// Note [Collective signature]
// Ranks must issue the same collectives in the same order: the same kind, reduction, root, dtype
// and element counts, collective by collective. Each rank folds every collective it issues into
// a running 64-bit signature, s_n = mix(s_{n-1}, seq, kind, op, root, dtype, numels), so that two
// ranks agree on s_n exactly when they agreed on collectives 1..n. It is checked two ways:
// - Before each call (CollectiveCheck, Gloo only): Gloo compares s_n across ranks before
//   collective n moves any data (a mismatched size would otherwise kill a rank inside Gloo, and a
//   mismatched dtype or op give a wrong result silently). It costs one small allreduce per call.
// - Always, asynchronously, on any backend: the heartbeat carries s at the rank's latest
//   collective, and each rank's health monitor compares its two neighbours' with its own history
//   (SignatureHistory) every interval, off the collectives' path; every adjacent pair is compared
//   by whichever is ahead. The first rank to see a difference announces it in the store; the two
//   ranks publish their signature lists, every rank finds the first number at which they differ
//   and publishes its call there. From then on every collective raises CommError naming each
//   rank's call and that number, a diagnosis of a failing or timed-out wait names it, and NCCL's
//   watchdog aborts the communicator so that its waits in flight fail. The mismatched collective
//   itself has run by then (its result may be wrong): the finding comes about one interval
//   later, at the next collective or wait. This is NCCL's check (a per-call one needs a host round
//   trip per collective), and Gloo's under DTCORE_CHECK_COLLECTIVES=0.
// Either way a mismatch is a CommError on every rank naming each rank's collective, and every
// later collective fails too.

// Note [Subgroup communicators]
// torch DDP reduces over any process group, e.g. the data-parallel replicas beside tensor
// parallelism (ranks {0,2} and {1,3} of 4). dtcore gives such a group a communicator of its own,
// built by the same code as the job's (python/dtcore/comm/subgroup.py calls
// bootstrap/join.py's connect()), once per group and cached on the context:
//  - Engine: on Gloo a c10d ProcessGroupGloo, on NCCL an NcclCommunicator, over the job's
//    rendezvous store seen through the prefix "group/<torch group name>/": torch names each group
//    once, alike on its members, so two groups never share a key. A member's rank in the
//    communicator is its index in the group's rank list (torch's group rank); rank() and size()
//    are those, and broadcast's root 0 is the group's first rank.
//  - Sequence numbers, signatures (Note [Collective signature]) and the flight recorder are the
//    communicator's own: the group's collectives are numbered and checked among its members
//    only. Its flight record goes to flight-group<name>-rank<job rank>.jsonl beside the job's,
//    each line naming the job rank (`dtcore.check --analyze` lines up the job's files).
//  - Health: a HealthMonitor of its own, whose heartbeats live under the group's prefix and
//    whose peers are the members, so that a dead member is judged against the group's sequence
//    numbers. Every message (timeouts, diagnoses, mismatches) names ranks by their job rank
//    (job_rank()), never by the rank inside the group.
//  - Shutdown: dtcore.shutdown() closes every subgroup communicator and its monitor (each monitor
//    writes its "left" beat) before the job's own, so nothing is left running.
// Members build a group's communicator collectively, as torch builds groups: in the same order on
// every member, which wrapping models in the same order gives.

// One collective, checked by the Communicator and handed to its engine.
struct Collective {
  CollectiveKind kind = CollectiveKind::Barrier;
  uint64_t seq = 0;             // 1, 2, ... in the order this rank issued them
  std::string what;             // "all_reduce #12 (torch.float32[4096], avg)", for messages
  at::Tensor input;             // all_reduce and broadcast: the tensor, in place; undefined for a barrier
  at::Tensor output;            // reduce_scatter and all_gather only
  ReduceOp op = ReduceOp::Sum;  // all_reduce and reduce_scatter
  int root = 0;                 // broadcast
  std::string label;            // the caller's name for it ("bucket 3/5"), for the flight recorder
  uint64_t signature = 0;       // See Note [Collective signature]
  // Called once by the engine's Work when the collective has finished (ok or not): the flight
  // recorder's end of it. Set by the Communicator.
  std::function<void(bool ok)> finished;
};

// "all_reduce (torch.float32[4096], avg)": the collective without its number, to set side by side
// with another rank's.
std::string describe(const Collective& c);

// Seconds the calling thread has spent blocked in Work::wait(), on any communicator, since it
// started. On the host's clock: with Gloo the whole wait for slower peers; with NCCL only what
// the host blocks for (the device's own waiting is not seen). The trainer subtracts it from a
// step's time to tell a rank's own work from waiting on the others (its straggler rule).
double wait_seconds();

// Note [Waiting on the stream]
// Work::wait() blocks the calling thread until the collective is done, on every backend: its
// timeout and its error are the caller's to see. On a GPU that has a cost. The thread that waits
// at the end of backward (the reducer) is the one that queues the optimizer step and the next
// forward; blocked until the last bucket is reduced, it lets the GPU's queue run dry, and the GPU
// then waits for each kernel launch of the step and the forward after it: 4-9 % of a GPT-2 step at
// world size 1 on an H100 (docs/benchmarks.md), where torch DDP's wait orders streams instead.
// wait_on_stream() is that stream-ordered wait: the caller's current stream waits on the
// collective's completion event and the thread goes on. Nothing is lost for failures:
//  - a collective already known to have failed raises here, as wait() would;
//  - one that fails or times out later is failed by the communicator's watchdog, which aborts the
//    communicator (Note [Abort marks in-flight work failed]); its kernels end, so the stream does
//    not hang, and the next collective or wait() on that communicator raises the failure, naming
//    the collective. Results computed after the failed collective on that stream are garbage, as
//    with torch DDP, and never leave the process through dtcore: a checkpoint save and every
//    reduction of a loss or metric go through the aborted communicator and raise.
//  - the collective's tensors go back to the caching allocator at wait_on_stream() when the
//    waiting stream is the one that launched the collective: it now runs after the collective,
//    and the allocator hands a freed block out again in the order of the stream it was allocated
//    on, which for the reducer's buckets is that stream (torch's NCCL process group assumes the
//    same at wait()). Otherwise the communicator's in-flight list holds them until its watchdog
//    sees the collective done, up to 100 ms later: on a fast GPU, a whole step of zero=2's
//    per-step gradient buckets.
// The reducer (finalize, and zero=2's bound on buckets in flight) and ShardedOptimizer's
// all-gathers use it; user-facing waits (dtcore.all_reduce, Work.wait in Python) block, since a
// script that reads the result on the host expects it.
class Work {
 public:
  explicit Work(std::chrono::milliseconds default_timeout, std::function<void(bool ok)> finished = {})
      : default_timeout_(default_timeout), finished_(std::move(finished)) {}
  virtual ~Work() = default;
  // Blocks until the collective is done and its result usable by the caller (on GPU: on the
  // caller's current stream). Throws CommError on failure, or when `timeout` passes first. The
  // time spent blocked is added to this thread's wait_seconds().
  void wait(std::chrono::milliseconds timeout);
  // The same with the communicator's timeout.
  void wait() { wait(default_timeout_); }
  // Orders the caller's later work after the collective, without blocking this thread where the
  // engine can: on NCCL the caller's current CUDA stream waits for the collective's completion
  // event; elsewhere this is wait(). Raises at once for a collective already known to have failed.
  // See Note [Waiting on the stream].
  virtual void wait_on_stream() { wait(); }
  // True once the collective has finished, successfully or not (wait() then returns or raises
  // at once). Never blocks.
  virtual bool is_completed() = 0;

 protected:
  // wait()'s work, by the engine.
  virtual void wait_for(std::chrono::milliseconds timeout) = 0;
  // The engine calls this when it learns the collective finished; only the first call counts.
  void report_finished(bool ok) {
    if (finished_ && !reported_.exchange(true)) finished_(ok);
  }

 private:
  const std::chrono::milliseconds default_timeout_;
  const std::function<void(bool ok)> finished_;
  std::atomic<bool> reported_{false};
};

// How a communicator checks that ranks call the same collectives; See Note [Collective signature].
enum class CollectiveCheck {
  kAuto,    // before every call on Gloo, where a mismatch would kill a rank; on NCCL the heartbeat's only
  kAlways,  // before every call, everywhere: refused on NCCL, which checks through the heartbeat only
  kNever,   // not before each call: a mismatch on Gloo may then abort a rank, or run and be found by the
            // heartbeat about one interval later
};

// Whether a Gloo communicator's ranks exchange through shared memory (DTCORE_SHM; See
// shm_exchange.h). NCCL has its own ways within a host.
enum class SharedMemory {
  kAuto,      // when every rank maps the segment; Gloo otherwise, with a line in the log saying why
  kRequired,  // every rank must map it: ConfigError naming the ranks that could not, and why
  kOff,       // never: Gloo only
};

struct CommunicatorOptions {
  std::chrono::milliseconds timeout =
      default_duration(knobs::kTimeout);  // every collective's, and Work::wait()'s default
  CollectiveCheck check = CollectiveCheck::kAuto;
  size_t flight_records = 2000;                      // collectives the flight recorder keeps
  SharedMemory shared_memory = SharedMemory::kAuto;  // Gloo only
  // A subgroup's communicator: the job rank of each member, by its rank in the communicator (the
  // group's rank list). Empty for the job's own communicator, whose rank r is job rank r. See
  // Note [Subgroup communicators].
  std::vector<int> ranks;

  // The options `settings` ask for (timeout, DTCORE_CHECK_COLLECTIVES, DTCORE_FLIGHT_RECORDER,
  // DTCORE_SHM).
  static CommunicatorOptions from(const Settings& settings);
  // The defaults with this timeout.
  static CommunicatorOptions with_timeout(std::chrono::milliseconds timeout) {
    CommunicatorOptions o;
    o.timeout = timeout;
    return o;
  }
};

class Communicator {
 public:
  Communicator(int rank, int size, std::chrono::milliseconds timeout)
      : Communicator(rank, size, Options::with_timeout(timeout)) {}
  using Options = CommunicatorOptions;
  // ConfigError when options.ranks is given but does not hold `size` job ranks.
  Communicator(int rank, int size, const Options& options);
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual std::string_view backend() const = 0;  // "gloo" | "nccl"
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The job rank of this communicator's rank `r`: r itself on the job's communicator, the
  // group's r-th rank on a subgroup's. Messages name ranks by it. See Note [Subgroup communicators].
  int job_rank(int r) const { return ranks_.empty() ? r : ranks_[static_cast<size_t>(r)]; }
  int job_rank() const { return job_rank(rank_); }
  // The members' job ranks, by rank in this communicator (0..size-1 on the job's).
  std::vector<int> job_ranks() const;
  // The default for Work::wait() and the engine's own operation timeout.
  std::chrono::milliseconds timeout() const { return timeout_; }
  // How ranks' collectives are checked against each other; See Note [Collective signature].
  CollectiveCheck check() const { return check_; }

  // With a monitor, every collective records its sequence number there, and a failure's
  // message names the dead or stalled ranks. Set once, before the first collective.
  void set_health(std::shared_ptr<HealthMonitor> health) {
    std::lock_guard<std::mutex> lock(issue_mu_);  // an engine's thread may read it meanwhile: divergence()
    health_ = std::move(health);
  }

  // The collectives. `label` names one for the flight recorder (e.g. "bucket 3/5").
  // In place: every rank's `tensor` becomes the reduction over ranks.
  std::shared_ptr<Work> all_reduce(const at::Tensor& tensor, ReduceOp op, std::string_view label = {});
  // input has size() * output.numel() elements; rank r receives the reduction of chunk r.
  std::shared_ptr<Work> reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                       std::string_view label = {});
  // output has size() * input.numel() elements; chunk r is rank r's input. The input may be this
  // rank's own chunk of the output (in place, as ZeRO's flat parameters gather); any other overlap
  // is a ConfigError.
  std::shared_ptr<Work> all_gather(const at::Tensor& output, const at::Tensor& input, std::string_view label = {});
  // In place from `root` to everyone.
  std::shared_ptr<Work> broadcast(const at::Tensor& tensor, int root, std::string_view label = {});
  std::shared_ptr<Work> barrier(std::string_view label = {});

  // `bytes` of zeroed memory (a uint8 tensor) in which an all-reduce costs less: on Gloo between
  // ranks that share a host, memory every rank maps, so that the reduction runs in place with no
  // copy through the exchange (See shm_buffers.h). A collective: every rank calls it with the same
  // size, in the same order as its collectives. Undefined where there is no such memory (another
  // backend, ranks on several hosts, a full /dev/shm): the caller allocates its own.
  virtual at::Tensor shared_buffer(int64_t /*bytes*/) { return {}; }
  // Whether shared_buffer() can give memory (alike on every rank, decided at construction).
  virtual bool offers_shared_buffers() const { return false; }

  // This rank's last collectives; see flight_recorder.h.
  const std::shared_ptr<FlightRecorder>& recorder() const { return recorder_; }
  // The flight record is dumped to `path` (lines naming this rank and `host`) on every failure
  // and on SIGUSR2 (unless the program handles that signal itself).
  void set_flight_dump(std::string path, std::string host) {
    recorder_->set_dump_file(std::move(path), job_rank(), size_, std::move(host));
    install_dump_signal();
  }

  // Releases the engine (connections, streams, threads), waiting at most timeout() for work in
  // flight. Idempotent; later collectives raise CommError. dtcore.shutdown() calls it, so that a
  // Context the user still holds keeps nothing alive.
  virtual void close() = 0;

 protected:
  // Starts `c` on the engine, asynchronously; its inputs are already checked. Throws CommError
  // when it cannot start (closed, aborted, engine failure).
  virtual std::shared_ptr<Work> start(const Collective& c) = 0;
  // The device type this communicator's tensors must live on.
  virtual bool accepts_device(const at::Tensor& t) const = 0;
  // What else the engine refuses (e.g. a dtype NCCL has no type for), as a ConfigError naming
  // `what` and `op_name`. Called with the other checks, before the collective is numbered, so a
  // refused call never leaves this rank's sequence ahead of its peers'.
  virtual void check_engine_input(const at::Tensor& /*t*/, std::string_view /*what*/,
                                  std::string_view /*op_name*/) const {}

  // The message for ranks that issued different collectives at `c` (their signatures differ):
  // each rank's call, gathered through the health monitor. Every rank calls it at the same
  // collective, since they all see the same mismatch.
  std::string mismatch_message(const Collective& c) const;

  // The health monitor's finding that the ranks called different collectives, "" while none (or
  // without a monitor). Calling the result never blocks: an engine's Work polls it while it waits,
  // and a watchdog to fail the work in flight. It holds the monitor, as diagnosis_for() does.
  // See Note [Collective signature].
  std::function<std::string()> divergence_probe() const;

  // What the health monitor will say about collective `seq` failing ("" without a monitor).
  // Calling the result blocks for about two heartbeat intervals: only on the failure path.
  // It holds the monitor, not the communicator, so a Work may outlive its communicator.
  std::function<std::string()> diagnosis_for(const Collective& c) const {
    return [health = health_, seq = c.seq, name = std::string(collective_name(c.kind))] {
      return health ? health->diagnose(seq, name) : std::string();
    };
  }

 private:
  // ConfigError unless `t` suits this communicator (device type, contiguity, dtype for `op`).
  void check_input(const at::Tensor& t, std::string_view what, std::string_view op_name,
                   const ReduceOp* op = nullptr) const;
  void check_flat_sizes(const at::Tensor& big, std::string_view big_name, const at::Tensor& small,
                        std::string_view small_name, std::string_view op_name) const;
  // Numbers, names, signs and records `c`, then starts it.
  std::shared_ptr<Work> issue(Collective c);

  const int rank_;
  const int size_;
  const std::vector<int> ranks_;  // See Options::ranks
  const std::chrono::milliseconds timeout_;
  const CollectiveCheck check_;
  const std::shared_ptr<FlightRecorder> recorder_;  // shared with the Works, which report their end
  // Issue order: the sequence number and the running signature advance together.
  mutable std::mutex issue_mu_;
  uint64_t seq_ = 0;
  uint64_t signature_ = 0;
  std::shared_ptr<HealthMonitor> health_;
  std::atomic<bool> divergence_dumped_{false};  // the flight record was dumped for it
};

}  // namespace dtcore
