// See nccl_communicator.h. Compiled only when CMake found the CUDA toolkit and NCCL.
#include "dtcore/comm/nccl_communicator.h"

#if defined(DTCORE_WITH_NCCL)

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>

#include <ATen/ATen.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "dtcore/common/backoff.h"
#include "dtcore/common/dtype.h"
#include "dtcore/common/env.h"
#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/log.h"

namespace dtcore {
namespace {

using Clock = std::chrono::steady_clock;

// How often the watchdog looks at the oldest work and at NCCL's asynchronous state.
constexpr auto kWatchdogInterval = std::chrono::milliseconds(100);
// After ncclCommAbort, how long close() waits for the stopped kernels to leave the stream before
// it lets go of their tensors. Stopped kernels exit within milliseconds; this only bounds a GPU
// that is itself stuck.
constexpr auto kAbortGrace = std::chrono::seconds(2);

// Seconds, to one decimal, for messages.
double seconds(Clock::duration d) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 100) / 10.0;
}

// GPU polls: 20 us doubling to 2 ms, so that short waits stay short and long ones cost no CPU.
// Waits the user sits in check for Ctrl-C; teardown passes kIgnore (see backoff.h).
Backoff gpu_backoff(Backoff::Interrupt interrupt = Backoff::Interrupt::kCheck) {
  return Backoff(std::chrono::microseconds(20), std::chrono::microseconds(2000), interrupt);
}

// ncclInProgress is not an error on a non-blocking communicator: the call goes on in the background.
bool is_nccl_error(ncclResult_t rc) { return rc != ncclSuccess && rc != ncclInProgress; }

// "unhandled system error (NCCL: <last error>)". ncclGetLastError ignores its argument.
std::string nccl_error_text(ncclResult_t rc) {
  std::string text = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') text += detail::cat(" (NCCL: ", last, ")");
  return text;
}

const char* nccl_fix(ncclResult_t rc) {
  return rc == ncclSystemError || rc == ncclRemoteError
             ? ". A peer rank may have exited or the network failed. Fix: look at the first error of the lowest "
               "failing rank; set NCCL_DEBUG=WARN for NCCL's own account."
             : ". Fix: set NCCL_DEBUG=WARN for NCCL's own account.";
}

// NCCL's type for a tensor's dtype; nullopt for a dtype NCCL has none for.
std::optional<ncclDataType_t> nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte:
    case at::kBool: return ncclUint8;
    default: return std::nullopt;
  }
}

// Only after check_engine_input() accepted the tensor.
ncclDataType_t to_nccl(const at::Tensor& t) { return nccl_type(t).value_or(ncclFloat32); }

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

const c10::impl::DeviceGuardImplInterface* cuda_impl() { return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA); }

// Sets the device for the scope: NCCL and CUDA runtime calls act on the current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = device;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

// Note [Abort marks in-flight work failed]
// ncclCommAbort stops the kernels of collectives still in flight, and a stopped kernel lets its
// stream move on: the done events recorded after it complete while the buffers hold partial
// results. A completed event therefore proves success only if it completed before the abort.
// abort_locked() settles every work still in flight before it calls ncclCommAbort: a work whose
// event has completed is marked succeeded, any other failed. A work's status leaves "pending"
// once, by compare-and-swap, so a wait() that sees an event complete after the abort finds the
// work failed already and cannot report success. launch() registers each work under the same
// mutex abort holds, so no work slips in between.

class NcclWork;

// The state a communicator shares with its works. See "Ownership" in nccl_communicator.h.
class NcclState {
 public:
  NcclState(int rank_, int device_, std::chrono::milliseconds timeout_)
      : rank(rank_), device(device_), timeout(timeout_), host(host_name()) {}
  // Only a constructor that threw, or a communicator leaked without close(), leaves handles here.
  ~NcclState() {
    if (comm != nullptr) ncclCommAbort(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  const int rank;
  const int device;
  const std::chrono::milliseconds timeout;  // the communicator's: the watchdog's limit
  const std::string host;

  // "rank 3 (GPU 1, host node7)": the where of every message.
  std::string where() const { return detail::cat("rank ", rank, " (GPU ", device, ", host ", host, ")"); }

  // Guards comm, stream and closed. Held across each enqueue (the failure check, the NCCL call,
  // its ncclInProgress poll, the event record and the registration), each abort and close()'s
  // teardown: a non-blocking communicator takes no other call while one is in progress, and an
  // abort must not free the communicator under an enqueue. Held at most about timeout() at a
  // time. Lock order: mu, then inflight_mu, then failure_mu_.
  std::mutex mu;
  ncclComm_t comm = nullptr;      // null once aborted or destroyed
  cudaStream_t stream = nullptr;  // the collectives' stream; null once close() destroyed it
  bool closed = false;            // set by close(): later collectives raise "communicator closed"

  // Works nobody has yet seen finish on the GPU, in launch order (one stream: they finish in that
  // order); the list keeps their tensors alive. inflight_mu is what the watchdog holds while it
  // waits on cv, and it is never held across an NCCL call. The works hold this state, so close()
  // empties the list to break the cycle.
  std::mutex inflight_mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<NcclWork>> inflight;
  bool stop = false;  // the watchdog leaves

  std::string failure() const {
    std::lock_guard<std::mutex> lock(failure_mu_);
    return failure_;
  }

  // Marks the in-flight works failed and aborts the communicator; the first reason sticks.
  // See Note [Abort marks in-flight work failed].
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    abort_locked(reason);
  }
  void abort_locked(const std::string& reason);  // mu held

  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress, or `deadline`
  // passes (then returns ncclInProgress). mu held, comm not null. Only set-up may end on Ctrl-C:
  // an enqueue or a teardown left half-done would strand a kernel or a communicator.
  ncclResult_t poll_async(Clock::time_point deadline, Backoff::Interrupt interrupt) const {
    Backoff backoff = gpu_backoff(interrupt);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
      if (rc != ncclSuccess) return rc;
      if (state != ncclInProgress || Clock::now() >= deadline) return state;
      backoff.pause();
    }
  }

  void check_cuda(cudaError_t rc, std::string_view what) const {
    DTCORE_CHECK(rc == cudaSuccess, CommError, what, " failed on ", where(), ": ", cudaGetErrorString(rc), " (",
                 cudaGetErrorName(rc), ")",
                 rc == cudaErrorMemoryAllocation
                     ? ". Fix: free GPU memory (smaller batch or buckets) or leave more to the NCCL buffers."
                     : ". Fix: the GPU may be in an error state after an earlier failure; find the first CUDA error "
                       "in this rank's log (CUDA_LAUNCH_BLOCKING=1 pins it to one kernel) and restart the job.");
  }
  // ncclInProgress passes: the caller polls.
  void check_nccl(ncclResult_t rc, std::string_view what) const {
    DTCORE_CHECK(!is_nccl_error(rc), CommError, what, " failed on ", where(), ": ", nccl_error_text(rc), nccl_fix(rc));
  }

 private:
  // A leaf lock of its own, so that wait() can read the failure while an enqueue holds mu.
  mutable std::mutex failure_mu_;
  std::string failure_;  // "" while healthy
};

class NcclWork final : public Work {
 public:
  enum Status : int { kPending, kSucceeded, kFailed };

  NcclWork(std::shared_ptr<NcclState> state, std::string what, std::vector<at::Tensor> keep_alive, cudaEvent_t done,
           c10::Stream caller, std::function<std::string()> diagnosis, std::function<void(bool)> finished)
      : Work(state->timeout, std::move(finished)),
        state_(std::move(state)),
        what_(std::move(what)),
        keep_alive_(std::move(keep_alive)),
        caller_(caller),
        done_(done),
        diagnosis_(std::move(diagnosis)),
        start_(Clock::now()) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  // True only once the collective has succeeded; a failure is false here and raised by wait().
  // Finished either way; wait() says which (a failed collective must not look pending forever).
  bool is_completed() override { return settle() != kPending; }

  using Work::wait;
  void wait_for(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    Backoff backoff = gpu_backoff();
    for (;;) {
      cudaError_t query = cudaSuccess;
      int status = settle(&query);  // the status first, the event second: see the Note
      if (status == kSucceeded) {
        order_caller_stream();
        return;
      }
      if (status == kFailed) {
        std::string failure = state_->failure();
        std::string who = diagnosis_();
        if (who == failure) who.clear();  // the communicator was aborted for what the diagnosis says
        DTCORE_CHECK(false, CommError, what_, " failed on ", state_->where(), ": ",
                     failure.empty() ? "the communicator was closed (close() or dtcore.shutdown()) before the "
                                       "collective completed. Fix: wait on every collective before dtcore.shutdown()."
                                     : "the NCCL communicator was aborted: " + failure,
                     who.empty() ? std::string() : "\n" + who);
      }
      DTCORE_CHECK(query == cudaErrorNotReady, CommError, what_, " failed on ", state_->where(),
                   ": its completion event reports ", cudaGetErrorString(query), " (", cudaGetErrorName(query),
                   "). Fix: the GPU is in an error state; find the first CUDA error in this rank's log "
                   "(CUDA_LAUNCH_BLOCKING=1 pins it to one kernel) and restart the job.");
      if (Clock::now() >= deadline) {
        // The caller's patience ran out, not the communicator's: the collective stays in flight
        // and the communicator usable; only the watchdog aborts, after timeout().
        std::string who = diagnosis_();
        DTCORE_CHECK(false, CommError, what_, " timed out on ", state_->where(), " after waiting ",
                     timeout.count() / 1000.0, " s (running for ", seconds(Clock::now() - start_),
                     " s): a peer rank has not taken part yet. The collective is still in flight; the communicator "
                     "aborts it if it is not done ",
                     state_->timeout.count() / 1000.0, " s after it started.", who.empty() ? std::string() : "\n" + who,
                     "\nFix: look at the first error of the lowest failing rank; if the work is just slow, wait "
                     "longer or raise init(timeout=) or ",
                     knobs::kTimeout.name, ".");
      }
      backoff.pause();
    }
  }

  // See Note [Waiting on the stream].
  void wait_on_stream() override {
    if (settle() == kFailed) wait_for(std::chrono::milliseconds(0));  // raises, naming the failure
    if (order_caller_stream() == caller_) {
      // The stream that launched the collective now waits for it, so its tensors may go back to the
      // allocator now rather than when the watchdog next sees the work done (every 100 ms: a whole
      // step of zero=2's gradient buckets on a fast GPU). See Note [Waiting on the stream].
      std::lock_guard<std::mutex> lock(keep_alive_mu_);
      keep_alive_.clear();
    }
  }

  const std::string& what() const { return what_; }
  Clock::time_point start() const { return start_; }
  int status() const { return status_.load(); }
  bool gpu_done() const { return cudaEventQuery(done_) == cudaSuccess; }

  // The status, settling a pending work whose event has completed as succeeded (unless an abort
  // failed it first). `query` receives the event's state when it was looked at.
  int settle(cudaError_t* query = nullptr) {
    int status = status_.load();
    if (status != kPending) return status;
    cudaError_t rc = cudaEventQuery(done_);
    if (query != nullptr) *query = rc;
    if (rc != cudaSuccess) return kPending;
    status_.compare_exchange_strong(status, kSucceeded);  // on failure, `status` holds the winner
    status = status_.load();
    report_finished(status == kSucceeded);  // the flight recorder's end of it
    return status;
  }
  // For abort_locked(), before ncclCommAbort: see Note [Abort marks in-flight work failed].
  void fail_unless_done() {
    int status = settle();
    if (status == kPending && status_.compare_exchange_strong(status, kFailed)) report_finished(false);
  }

 private:
  // The result is usable on the caller's current stream: order that stream after the collective.
  // Returns that stream.
  c10::Stream order_caller_stream() {
    try {
      auto* impl = cuda_impl();
      c10::Stream current = impl->getStream(c10::Device(c10::DeviceType::CUDA, state_->device));
      impl->block(static_cast<void*>(done_), current);
      return current;
    } catch (const c10::Error& e) {
      DTCORE_CHECK(false, CommError, what_, " completed on ", state_->where(),
                   ", but ordering the caller's current stream after it failed: ", e.what_without_backtrace(),
                   ". Fix: the GPU may be in an error state; find the first CUDA error in this rank's log.");
    }
    return caller_;  // unreachable
  }

  std::shared_ptr<NcclState> state_;  // shared: the work may outlive its communicator
  std::string what_;
  std::mutex keep_alive_mu_;
  std::vector<at::Tensor> keep_alive_;  // referenced until the work is gone or waited on (not recordStream)
  c10::Stream caller_;                  // the caller's current stream at launch
  cudaEvent_t done_;                    // recorded on the NCCL stream after the collective
  std::function<std::string()> diagnosis_;
  Clock::time_point start_;
  // kPending until settled, then final. See Note [Abort marks in-flight work failed].
  std::atomic<int> status_{kPending};
};

void NcclState::abort_locked(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (!failure_.empty()) return;
    failure_ = reason;
  }
  {
    std::lock_guard<std::mutex> lock(inflight_mu);
    for (auto& work : inflight) work->fail_unless_done();
  }
  log::error("nccl: aborting the communicator on ", where(), ": ", reason);
  if (comm != nullptr) {
    DeviceScope scope(device);
    // Always returns at once on a non-blocking communicator; the handle is gone either way.
    ncclResult_t rc = ncclCommAbort(comm);
    comm = nullptr;
    if (is_nccl_error(rc)) log::warn("nccl: ncclCommAbort on ", where(), " reported ", nccl_error_text(rc));
  }
}

NcclCommunicator::NcclCommunicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int device,
                                   const Options& options)
    : Communicator(rank, size, options),
      state_(std::make_shared<NcclState>(rank, device, options.timeout)),
      device_(device) {
  DTCORE_CHECK(options.check != CollectiveCheck::kAlways, ConfigError, knobs::kCheckCollectives.name,
               "=1 asks to check every collective across ranks before it runs, which dtcore's NCCL communicator "
               "does not do (it would cost a host round trip per call); on NCCL a mismatch is found through the "
               "heartbeat about one interval after it ran. Fix: unset it for NCCL, or find a mismatch on CPU "
               "(dtcore.init(backend='gloo'), where every call is checked before it runs).");
  const std::chrono::milliseconds timeout = options.timeout;
  NcclState& s = *state_;
  DeviceScope scope(device);
  ncclUniqueId id;
  const std::string key = "nccl/unique_id";
  if (rank == 0) {
    s.check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    auto* p = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
  } else {
    std::vector<uint8_t> bytes;
    try {
      bytes = store->get(key);  // blocks up to the store's timeout
    } catch (const c10::DistStoreError& e) {
      DTCORE_CHECK(
          false, CommError, s.where(),
          " timed out waiting for the NCCL unique id: rank 0 never published "
          "it in the rendezvous store (",
          e.what_without_backtrace(),
          "). Rank 0 may have failed before it "
          "created its NCCL communicator. Fix: look at rank 0's log for its first error; if rank 0 is only slow to "
          "reach dtcore.init(), raise init(timeout=) or ",
          knobs::kTimeout.name, ".");
    } catch (const c10::DistNetworkError& e) {
      DTCORE_CHECK(false, CommError, s.where(),
                   " lost the rendezvous store while waiting for rank 0's NCCL unique "
                   "id (",
                   e.what_without_backtrace(),
                   "): the store's host (rank 0) may have exited. Fix: look at "
                   "rank 0's log for its first error.");
    }
    DTCORE_CHECK(bytes.size() == sizeof(id), CommError, s.where(), " read a malformed NCCL id (", bytes.size(),
                 " bytes, expected ", sizeof(id),
                 ") from the rendezvous store. Fix: make sure every rank runs the "
                 "same NCCL.");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }

  try {
    s.check_cuda(cudaStreamCreateWithPriority(&s.stream, cudaStreamNonBlocking, -1), "cudaStreamCreateWithPriority");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a rank that never shows up cannot hang initialization
    const auto deadline = Clock::now() + timeout;
    s.check_nccl(ncclCommInitRankConfig(&s.comm, size, id, rank, &config), "ncclCommInitRankConfig");
    DTCORE_CHECK(s.comm != nullptr, CommError, "ncclCommInitRankConfig on ", s.where(),
                 " returned no communicator. Fix: set NCCL_DEBUG=WARN for NCCL's own account.");
    // Non-blocking: the set-up goes on in the background until the state leaves ncclInProgress.
    ncclResult_t rc = s.poll_async(deadline, Backoff::Interrupt::kCheck);
    DTCORE_CHECK(rc != ncclInProgress, CommError, "NCCL communicator set-up timed out after ", timeout.count() / 1000.0,
                 " s on ", s.where(),
                 ": some rank did not join. Fix: check that every "
                 "rank reached dtcore.init(); set NCCL_DEBUG=WARN for NCCL's account.");
    s.check_nccl(rc, "NCCL communicator set-up");
    watchdog_ = std::thread([this] { watchdog_loop(); });
  } catch (...) {
    // No destructor runs for a constructor that threw: release NCCL's threads and the stream here.
    if (s.comm != nullptr) ncclCommAbort(s.comm);
    s.comm = nullptr;
    if (s.stream != nullptr) cudaStreamDestroy(s.stream);
    s.stream = nullptr;
    throw;
  }
  log::debug("nccl: communicator ready on ", s.where(), " (world size ", size, ", NCCL ", nccl_runtime_version(), ")");
}

void NcclCommunicator::close() {
  std::lock_guard<std::mutex> close_lock(close_mu_);
  if (closed_) return;
  closed_ = true;
  NcclState& s = *state_;

  // The watchdog leaves first: from here close() bounds the wait itself.
  {
    std::lock_guard<std::mutex> lock(s.inflight_mu);
    s.stop = true;
  }
  s.cv.notify_all();
  if (watchdog_.joinable()) watchdog_.join();

  const auto start = Clock::now();
  const auto deadline = start + timeout();
  std::unique_lock<std::mutex> lock(s.mu);
  s.closed = true;
  DeviceScope scope(device_);
  if (s.comm != nullptr) {
    // 1. Let the collectives in flight finish, watching NCCL for errors meanwhile.
    std::string problem;  // why the orderly teardown gave up; "" while it goes on
    Backoff backoff = gpu_backoff(Backoff::Interrupt::kIgnore);
    for (;;) {
      cudaError_t query = cudaStreamQuery(s.stream);
      if (query == cudaSuccess) break;
      if (query != cudaErrorNotReady) {
        problem = detail::cat("the NCCL stream reports ", cudaGetErrorString(query));
        break;
      }
      ncclResult_t async = ncclSuccess;
      ncclResult_t rc = ncclCommGetAsyncError(s.comm, &async);
      if (rc != ncclSuccess) async = rc;
      if (is_nccl_error(async)) {
        problem = detail::cat("NCCL reported ", nccl_error_text(async), " with collectives in flight");
        break;
      }
      if (Clock::now() >= deadline) {
        std::lock_guard<std::mutex> inflight_lock(s.inflight_mu);
        problem = detail::cat("collectives were still in flight after ", timeout().count() / 1000.0, " s",
                              s.inflight.empty() ? std::string() : " (the oldest: " + s.inflight.front()->what() + ")");
        break;
      }
      backoff.pause();
    }
    // 2. ncclCommFinalize flushes NCCL's own work; on a non-blocking communicator it answers
    //    ncclInProgress and the state must leave ncclInProgress before ncclCommDestroy.
    if (problem.empty()) {
      ncclResult_t rc = ncclCommFinalize(s.comm);
      if (!is_nccl_error(rc)) rc = s.poll_async(deadline, Backoff::Interrupt::kIgnore);
      if (rc == ncclSuccess) {
        rc = ncclCommDestroy(s.comm);  // local only once finalized: does not block
        s.comm = nullptr;
        if (is_nccl_error(rc)) log::warn("nccl: ncclCommDestroy on ", s.where(), " reported ", nccl_error_text(rc));
      } else if (rc == ncclInProgress) {
        problem = detail::cat("ncclCommFinalize did not finish within ", timeout().count() / 1000.0,
                              " s (a peer rank may be gone)");
      } else {
        problem = detail::cat("ncclCommFinalize failed: ", nccl_error_text(rc));
      }
    }
    if (!problem.empty()) {
      s.abort_locked(detail::cat(
          "close() on ", s.where(), " could not shut the NCCL communicator down in order: ", problem,
          ". It was aborted instead, and collectives still in flight failed. Fix: look at the first error of the "
          "lowest failing rank; wait on every collective before dtcore.shutdown(), on every rank."));
    }
  }
  // 3. After an abort (here or earlier), give the stopped kernels a moment to leave the stream, so
  //    that their tensors are not released under them.
  if (s.stream != nullptr && !s.failure().empty()) {
    const auto grace = Clock::now() + kAbortGrace;
    Backoff backoff = gpu_backoff(Backoff::Interrupt::kIgnore);
    while (cudaStreamQuery(s.stream) == cudaErrorNotReady && Clock::now() < grace) backoff.pause();
  }
  // 4. Settle and release the works (which breaks their cycle with the state), then the stream.
  std::deque<std::shared_ptr<NcclWork>> released;
  {
    std::lock_guard<std::mutex> inflight_lock(s.inflight_mu);
    for (auto& work : s.inflight) work->fail_unless_done();
    released.swap(s.inflight);
  }
  size_t still_running = static_cast<size_t>(
      std::count_if(released.begin(), released.end(), [](const auto& work) { return !work->gpu_done(); }));
  if (still_running > 0) {
    log::warn("nccl: ", still_running, " collective(s) on ", s.where(), " were still on the GPU ", seconds(kAbortGrace),
              " s after the abort; their tensors are released now. Fix: restart the process "
              "before using this GPU again.");
  }
  if (s.stream != nullptr) cudaStreamDestroy(s.stream);  // returns at once; freed when the GPU is done
  s.stream = nullptr;
  lock.unlock();
  released.clear();  // tensors freed outside the locks
  log::debug("nccl: communicator on ", s.where(), " closed after ", seconds(Clock::now() - start), " s");
}

NcclCommunicator::~NcclCommunicator() {
  try {
    close();
  } catch (const std::exception& e) {
    log::error("nccl: closing the communicator on rank ", rank(), " failed: ", e.what());
  } catch (...) {
    log::error("nccl: closing the communicator on rank ", rank(), " failed");
  }
}

void NcclCommunicator::check_engine_input(const at::Tensor& t, std::string_view what, std::string_view op_name) const {
  DTCORE_CHECK(nccl_type(t).has_value(), ConfigError, op_name, ": ", what, " is ", dtype_name(t.scalar_type()),
               ", which NCCL cannot carry. Fix: convert it to torch.float32, torch.bfloat16, torch.float16, "
               "torch.float64, torch.int32, torch.int64, torch.int8 or torch.uint8.");
}

bool NcclCommunicator::accepts_device(const at::Tensor& t) const {
  return t.device().is_cuda() && t.device().index() == device_;
}

std::string NcclCommunicator::failure() const { return state_->failure(); }

template <typename Enqueue>
std::shared_ptr<Work> NcclCommunicator::launch(const Collective& c, std::vector<at::Tensor> keep_alive,
                                               Enqueue&& enqueue) {
  const std::string& what = c.what;
  NcclState& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);  // See NcclState::mu.
  DTCORE_CHECK(!s.closed, CommError, what, " cannot start on ", s.where(),
               ": communicator closed (close() or "
               "dtcore.shutdown() ran). Fix: call dtcore.init() again before more collectives.");
  std::string failure = s.failure();
  DTCORE_CHECK(failure.empty() && s.comm != nullptr, CommError, what, " cannot start on ", s.where(),
               ": the NCCL communicator was aborted earlier: ", failure,
               " Fix: this job cannot go on with it; restart the job after fixing the first error above.");
  DeviceScope scope(device_);
  // The collective's inputs are produced on the caller's stream: wait for them there.
  cudaError_t waited = cudaSuccess;
  c10::Stream caller = c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CUDA, device_));
  try {
    auto* impl = cuda_impl();
    c10::Stream current = impl->getStream(c10::Device(c10::DeviceType::CUDA, device_));
    caller = current;
    void* ready = nullptr;
    impl->record(&ready, current, device_, c10::EventFlag::PYTORCH_DEFAULT);
    waited = cudaStreamWaitEvent(s.stream, static_cast<cudaEvent_t>(ready), 0);
    impl->destroyEvent(ready, device_);  // released once recorded work completes
  } catch (const c10::Error& e) {
    DTCORE_CHECK(false, CommError, what, " could not start on ", s.where(),
                 ": recording the caller's current "
                 "stream failed: ",
                 e.what_without_backtrace(),
                 ". Fix: the GPU may be in an error state; find the "
                 "first CUDA error in this rank's log.");
  }
  s.check_cuda(waited, "cudaStreamWaitEvent (ordering the NCCL stream after the caller's)");

  // The event comes first so that a failure here happens before anything is enqueued; the work
  // owns it from here on.
  cudaEvent_t done = nullptr;
  s.check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  auto work =
      std::make_shared<NcclWork>(state_, what, std::move(keep_alive), done, caller, diagnosis_for(c), c.finished);

  ncclResult_t rc = enqueue(s.comm, s.stream);
  // Non-blocking: ncclInProgress means NCCL may not have put the kernel on the stream yet, so the
  // event must wait until the communicator's state leaves ncclInProgress.
  if (rc == ncclInProgress) rc = s.poll_async(Clock::now() + timeout(), Backoff::Interrupt::kIgnore);
  if (rc != ncclSuccess) {
    ncclResult_t state = ncclSuccess;
    if (rc != ncclInProgress && ncclCommGetAsyncError(s.comm, &state) != ncclSuccess) state = ncclInternalError;
    if ((rc == ncclInvalidArgument || rc == ncclInvalidUsage) && !is_nccl_error(state)) {
      // NCCL refused the arguments before doing anything: the communicator is still sound.
      DTCORE_CHECK(false, CommError, work->what(), " could not start on ", s.where(),
                   ": NCCL refused the call: ", nccl_error_text(rc),
                   ". The communicator is still usable. Fix: this is likely a dtcore bug; "
                   "report it with the output of NCCL_DEBUG=WARN.");
    }
    std::string reason =
        rc == ncclInProgress
            ? detail::cat(work->what(), " was still being enqueued by NCCL ", timeout().count() / 1000.0,
                          " s later on ", s.where(),
                          ": a peer rank probably never joined the connection set-up. "
                          "Fix: look at the first error of the lowest failing rank; set NCCL_DEBUG=WARN for NCCL's "
                          "account.")
            : detail::cat(work->what(), " failed to start on ", s.where(), ": ", nccl_error_text(rc), nccl_fix(rc));
    s.abort_locked(reason);
    throw CommError(reason);
  }
  cudaError_t recorded = cudaEventRecord(done, s.stream);
  if (recorded != cudaSuccess) {
    // The collective is enqueued but cannot be tracked: nothing could tell when its buffers are free.
    std::string reason = detail::cat("cudaEventRecord after ", work->what(), " failed on ", s.where(), ": ",
                                     cudaGetErrorString(recorded),
                                     ". Fix: the GPU may be in an error state; find "
                                     "the first CUDA error in this rank's log and restart the job.");
    s.abort_locked(reason);
    throw CommError(reason);
  }
  {
    std::lock_guard<std::mutex> inflight_lock(s.inflight_mu);
    s.inflight.push_back(work);
  }
  return work;
}

void NcclCommunicator::watchdog_loop() {
  NcclState& s = *state_;
  cudaSetDevice(device_);  // the event queries and an abort act on this GPU
  for (;;) {
    std::vector<std::shared_ptr<NcclWork>> finished;  // released outside the lock: they free tensors
    std::string reason;
    {
      std::unique_lock<std::mutex> lock(s.inflight_mu);
      s.cv.wait_for(lock, kWatchdogInterval, [&] { return s.stop; });
      if (s.stop) return;
      // Works the GPU is done with release their tensors, succeeded or failed.
      while (!s.inflight.empty() && s.inflight.front()->gpu_done()) {
        s.inflight.front()->settle();
        finished.push_back(std::move(s.inflight.front()));
        s.inflight.pop_front();
      }
      // The oldest pending work against the timeout (a failed one is already accounted for).
      if (!s.inflight.empty() && s.inflight.front()->status() == NcclWork::kPending &&
          Clock::now() - s.inflight.front()->start() > timeout()) {
        const NcclWork& oldest = *s.inflight.front();
        reason =
            detail::cat(oldest.what(), " did not complete within ", timeout().count() / 1000.0, " s on ", s.where(),
                        ": a peer rank did not take part or stalled. Fix: look at the first error "
                        "of the lowest failing rank; if the work is just slow, raise init(timeout=) or ",
                        knobs::kTimeout.name, ".");
      }
    }
    finished.clear();
    // The ranks called different collectives (found through the heartbeat): the works in flight
    // would hang or return wrong data. See Note [Collective signature].
    if (reason.empty() && s.failure().empty()) reason = divergence_probe()();
    if (!reason.empty()) {
      s.abort(reason);  // waits for an enqueue in progress, which is itself bounded by timeout()
      continue;
    }
    // Asynchronous errors: a peer's connection dropped, a proxy thread failed. While an enqueue
    // holds mu it polls the same state itself, so the watchdog skips a turn instead of waiting.
    std::unique_lock<std::mutex> lock(s.mu, std::try_to_lock);
    if (!lock.owns_lock() || s.comm == nullptr) continue;
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(s.comm, &async);
    if (rc != ncclSuccess) async = rc;
    if (is_nccl_error(async)) {
      s.abort_locked(detail::cat("NCCL reported an asynchronous error on ", s.where(), ": ", nccl_error_text(async),
                                 nccl_fix(async)));
    }
  }
}

std::shared_ptr<Work> NcclCommunicator::start(const Collective& c) {
  const at::Tensor& in = c.input;
  const at::Tensor& out = c.output;
  switch (c.kind) {
    case CollectiveKind::AllReduce: {
      auto dtype = to_nccl(in);
      return launch(c, {in}, [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclAllReduce(in.data_ptr(), in.data_ptr(), in.numel(), dtype, to_nccl(c.op), comm, stream);
      });
    }
    case CollectiveKind::ReduceScatter: {
      auto dtype = to_nccl(in);
      return launch(c, {out, in}, [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), dtype, to_nccl(c.op), comm, stream);
      });
    }
    case CollectiveKind::AllGather: {
      auto dtype = to_nccl(in);
      return launch(c, {out, in}, [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), dtype, comm, stream);
      });
    }
    case CollectiveKind::Broadcast: {
      auto dtype = to_nccl(in);
      return launch(c, {in}, [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclBroadcast(in.data_ptr(), in.data_ptr(), in.numel(), dtype, c.root, comm, stream);
      });
    }
    case CollectiveKind::Barrier: {
      // NCCL has no barrier: a one-element allreduce on the comm stream is one.
      at::Tensor token =
          at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(c10::Device(c10::DeviceType::CUDA, device_)));
      return launch(c, {token}, [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm, stream);
      });
    }
  }
  DTCORE_CHECK(false, CommError, "dtcore bug: collective kind ", static_cast<int>(c.kind), " unknown");
  return nullptr;  // unreachable
}

std::string nccl_runtime_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return detail::cat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace dtcore

#endif  // DTCORE_WITH_NCCL
