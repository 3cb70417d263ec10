// NcclCommunicator: dtcore's own NCCL communicator for CUDA tensors (built only with NCCL).
//
// Set-up: rank 0 creates the NCCL unique id and shares it through the rendezvous store; the
// communicator is created non-blocking (config.blocking = 0) so that its initialization, its
// enqueues and its teardown all obey the timeout: every NCCL call that answers ncclInProgress is
// followed by polling ncclCommGetAsyncError against a deadline, never by a blind wait.
// Each collective runs on the communicator's own high-priority stream, ordered after the
// caller's current stream by an event, and records a completion event. A watchdog thread polls
// those events and ncclCommGetAsyncError: a collective that outlives timeout(), or an
// asynchronous NCCL error, aborts the communicator (ncclCommAbort), so a collective never hangs
// forever, and every later call and wait raises CommError with the reason.
// See Note [Abort marks in-flight work failed] in the .cpp for why a completed event alone does
// not prove a collective succeeded.
//
// Tensors stay referenced until their collective completes (not recordStream), so the caching
// allocator cannot hand their memory to anyone while NCCL still reads or writes it.
// Stream and event interplay with torch goes through c10's DeviceGuardImplInterface, so this
// file needs the CUDA runtime and NCCL but not torch's CUDA libraries to build. This header
// names no CUDA or NCCL type: the bindings include it without NCCL's include path.
//
// Ownership: the NCCL handle, the stream and the failure state live in a NcclState shared by the
// communicator and every Work it returned, so a Work may outlive the communicator (Python may
// hold one after dtcore.shutdown()). close() tears down within timeout() and is idempotent; the
// destructor calls it.
//
// Thread safety: collectives from one thread at a time (see communicator.h); wait(),
// is_completed() and close() from any thread. Enqueues, aborts and teardown are serialized on
// the state's mutex; the watchdog never holds it while it waits.
#pragma once

#if defined(DTCORE_WITH_NCCL)

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtcore/comm/communicator.h"

namespace dtcore {

class NcclState;  // NCCL and CUDA handles, failure and in-flight works; kept out of this header

class NcclCommunicator final : public Communicator {
 public:
  // `store` is shared by all ranks (the rendezvous store, under a prefix of the caller's).
  // Throws CommError when rank 0's NCCL id never arrives or NCCL set-up fails or times out.
  NcclCommunicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int device,
                   const Options& options);
  NcclCommunicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int device,
                   std::chrono::milliseconds timeout)
      : NcclCommunicator(store, rank, size, device, Options::with_timeout(timeout)) {}
  ~NcclCommunicator() override;  // close()

  std::string_view backend() const override { return "nccl"; }
  // Waits at most timeout() for work in flight, then ncclCommFinalize + ncclCommDestroy; on an
  // error or at the deadline, ncclCommAbort instead (works still in flight then fail). Idempotent;
  // a second caller waits for the first to finish. NCCL and CUDA failures are logged, not thrown.
  void close() override;

  // "" while healthy; otherwise why the communicator was aborted.
  std::string failure() const;

 protected:
  std::shared_ptr<Work> start(const Collective& c) override;
  bool accepts_device(const at::Tensor& t) const override;
  void check_engine_input(const at::Tensor& t, std::string_view what, std::string_view op_name) const override;

 private:
  template <typename Enqueue>
  std::shared_ptr<Work> launch(const Collective& c, std::vector<at::Tensor> keep_alive, Enqueue&& enqueue);
  void watchdog_loop();

  std::shared_ptr<NcclState> state_;  // shared with every NcclWork: see "Ownership" above
  int device_;

  // Serializes close() callers (the destructor and dtcore.shutdown() may race); guards closed_.
  // Held for the whole teardown, so it is never taken by launch(), wait() or the watchdog.
  std::mutex close_mu_;
  bool closed_ = false;
  std::thread watchdog_;  // joined by close()
};

// NCCL's version as "2.21.5", or "" when dtcore was built without NCCL.
std::string nccl_runtime_version();

}  // namespace dtcore

#else

#include <string>

namespace dtcore {
inline std::string nccl_runtime_version() { return ""; }
}  // namespace dtcore

#endif
