// NcclCommunicator: dtcore's own NCCL communicator for CUDA tensors (built only with NCCL).
//
// Set-up: rank 0 creates the NCCL unique id and shares it through the rendezvous store; the
// communicator is created non-blocking so that its initialization, too, obeys the timeout.
// Each collective runs on the communicator's own high-priority stream, ordered after the
// caller's current stream by an event, and records a completion event. A watchdog thread polls
// those events and ncclCommGetAsyncError: a collective that outlives the timeout, or an
// asynchronous NCCL error, aborts the communicator (ncclCommAbort), so a collective never hangs
// forever, and every later call and wait raises CommError with the reason.
//
// Tensors stay referenced until their collective completes (not recordStream), so the caching
// allocator cannot hand their memory to anyone while NCCL still reads or writes it.
// Stream and event interplay with torch goes through c10's DeviceGuardImplInterface, so this
// file needs the CUDA runtime and NCCL but not torch's CUDA libraries to build.
//
// Thread safety: collectives from one thread at a time (see communicator.h); wait() and the
// watchdog synchronize on an internal mutex.
#pragma once

#if defined(DTCORE_WITH_NCCL)

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtcore/comm/communicator.h"

namespace dtcore {

class NcclWork;

class NcclCommunicator final : public Communicator {
 public:
  // `store` is shared by all ranks (the rendezvous store, under a prefix of the caller's).
  NcclCommunicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int device,
                   std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  std::string_view backend() const override { return "nccl"; }
  std::shared_ptr<Work> allreduce(const at::Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  std::shared_ptr<Work> all_gather(const at::Tensor& output, const at::Tensor& input) override;
  std::shared_ptr<Work> broadcast(const at::Tensor& tensor, int root) override;
  std::shared_ptr<Work> barrier() override;

  // "" while healthy; otherwise why the communicator was aborted.
  std::string failure() const;

 protected:
  bool accepts_device(const at::Tensor& t) const override;

 private:
  friend class NcclWork;
  template <typename Enqueue>
  std::shared_ptr<Work> launch(std::string_view op_name, uint64_t seq, const at::Tensor& described, const ReduceOp* op,
                               std::vector<at::Tensor> keep_alive, Enqueue&& enqueue);
  void watchdog_loop();
  void abort(const std::string& reason);  // idempotent

  struct Impl;  // NCCL and CUDA handles, kept out of this header
  std::unique_ptr<Impl> impl_;
  int device_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclWork>> inflight_;  // in launch order
  std::string failure_;
  bool stop_ = false;
  std::thread watchdog_;
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
