// See nccl_communicator.h. Compiled only when CMake found the CUDA toolkit and NCCL.
#include "dtcore/comm/nccl_communicator.h"

#if defined(DTCORE_WITH_NCCL)

#include <cstring>

#include <ATen/ATen.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "dtcore/common/error.h"
#include "dtcore/common/log.h"

namespace dtcore {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t rc, const char* what) {
  DTCORE_CHECK(rc == cudaSuccess, CommError, what, " failed: ", cudaGetErrorString(rc));
}

void check_nccl(ncclResult_t rc, const char* what) {
  DTCORE_CHECK(rc == ncclSuccess || rc == ncclInProgress, CommError, what, " failed: ", ncclGetErrorString(rc),
               rc == ncclSystemError || rc == ncclRemoteError
                   ? ". A peer may have exited or the network failed; set NCCL_DEBUG=WARN for NCCL's own account."
                   : ". Set NCCL_DEBUG=WARN for NCCL's own account.");
}

ncclDataType_t to_nccl(const at::Tensor& t) {
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
    default:
      DTCORE_CHECK(false, ConfigError, "NCCL cannot reduce ", c10::toString(t.scalar_type()),
                   " tensors. Fix: convert to float32, bfloat16, float16, float64, int32, int64 or uint8.");
  }
  return ncclFloat32;  // unreachable
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

const c10::impl::DeviceGuardImplInterface* cuda_impl() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

// Sets the device for the scope: NCCL and CUDA runtime calls act on the current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* owner, std::string what, std::vector<at::Tensor> keep_alive, cudaEvent_t done,
           std::function<std::string()> diagnosis)
      : owner_(owner),
        what_(std::move(what)),
        keep_alive_(std::move(keep_alive)),
        done_(done),
        diagnosis_(std::move(diagnosis)),
        start_(Clock::now()) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  bool is_completed() override { return cudaEventQuery(done_) == cudaSuccess; }

  void wait(std::chrono::milliseconds timeout) override {
    // Order the caller's current stream after the collective, then block the host until it is
    // done so that a timeout can be reported here rather than in some later kernel.
    auto* impl = cuda_impl();
    impl->block(static_cast<void*>(done_), impl->getStream(c10::Device(c10::DeviceType::CUDA, owner_->device_)));
    auto deadline = Clock::now() + timeout;
    auto delay = std::chrono::microseconds(20);
    for (;;) {
      cudaError_t rc = cudaEventQuery(done_);
      if (rc == cudaSuccess) return;
      std::string failure = owner_->failure();
      DTCORE_CHECK(failure.empty(), CommError, what_, " failed on rank ", owner_->rank(), ": ", failure);
      DTCORE_CHECK(rc == cudaErrorNotReady, CommError, what_, " failed on rank ", owner_->rank(), ": ",
                   cudaGetErrorString(rc));
      if (Clock::now() >= deadline) {
        double waited = std::chrono::duration<double>(Clock::now() - start_).count();
        std::string reason = detail::cat(what_, " timed out on rank ", owner_->rank(), " after ",
                                         static_cast<int>(waited * 10) / 10.0, " s: a peer rank did not take part. "
                                         "The NCCL communicator was aborted. Fix: look at the first error of the "
                                         "lowest failing rank; if the work is just slow, raise init(timeout=) or "
                                         "DTCORE_TIMEOUT.");
        owner_->abort(reason);
        std::string who = diagnosis_();
        throw CommError(who.empty() ? reason : reason + "\n" + who);
      }
      std::this_thread::sleep_for(delay);
      delay = std::min(delay * 2, std::chrono::microseconds(2000));
    }
  }

 private:
  friend class NcclCommunicator;
  NcclCommunicator* owner_;  // outlives its works: the destructor drains them
  std::string what_;
  std::vector<at::Tensor> keep_alive_;
  cudaEvent_t done_;
  std::function<std::string()> diagnosis_;
  Clock::time_point start_;
};

NcclCommunicator::NcclCommunicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int device,
                                   std::chrono::milliseconds timeout)
    : Communicator(rank, size, timeout), impl_(std::make_unique<Impl>()), device_(device) {
  DeviceScope scope(device);
  ncclUniqueId id;
  const std::string key = "nccl/unique_id";
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    auto* p = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
  } else {
    auto bytes = store->get(key);  // blocks up to the store's timeout
    DTCORE_CHECK(bytes.size() == sizeof(id), CommError, "rank ", rank, " read a malformed NCCL id (", bytes.size(),
                 " bytes) from the rendezvous store. Fix: make sure every rank runs the same NCCL.");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  check_cuda(cudaStreamCreateWithPriority(&impl_->stream, cudaStreamNonBlocking, -1), "cudaStreamCreateWithPriority");

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a rank that never shows up cannot hang initialization
  check_nccl(ncclCommInitRankConfig(&impl_->comm, size, id, rank, &config), "ncclCommInitRankConfig");
  auto deadline = Clock::now() + timeout;
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    check_nccl(ncclCommGetAsyncError(impl_->comm, &state), "ncclCommGetAsyncError");
    if (state == ncclInProgress && Clock::now() >= deadline) {
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      DTCORE_CHECK(false, CommError, "NCCL communicator set-up timed out after ", timeout.count() / 1000.0,
                   " s on rank ", rank, " (GPU ", device, "): some rank did not join. Fix: check that every rank "
                   "reached dtcore.init(); set NCCL_DEBUG=WARN for NCCL's account.");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  check_nccl(state, "NCCL communicator set-up");
  watchdog_ = std::thread([this] { watchdog_loop(); });
  log::debug("nccl: communicator ready on GPU ", device, " (rank ", rank, "/", size, ", NCCL ",
             nccl_runtime_version(), ")");
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  DeviceScope scope(device_);
  if (impl_->comm != nullptr) {
    if (failure().empty()) {
      cudaStreamSynchronize(impl_->stream);
      ncclCommFinalize(impl_->comm);
      ncclCommDestroy(impl_->comm);
    } else {
      ncclCommAbort(impl_->comm);
    }
  }
  inflight_.clear();
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

bool NcclCommunicator::accepts_device(const at::Tensor& t) const {
  return t.device().is_cuda() && t.device().index() == device_;
}

std::string NcclCommunicator::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void NcclCommunicator::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) return;
  failure_ = reason;
  log::error("nccl: aborting the communicator: ", reason);
  if (impl_->comm != nullptr) ncclCommAbort(impl_->comm);
  impl_->comm = nullptr;
}

template <typename Enqueue>
std::shared_ptr<Work> NcclCommunicator::launch(std::string_view op_name, uint64_t seq, const at::Tensor& described,
                                               const ReduceOp* op, std::vector<at::Tensor> keep_alive,
                                               Enqueue&& enqueue) {
  std::string what = describe(op_name, seq, described, op);
  std::string failure = this->failure();
  DTCORE_CHECK(failure.empty(), CommError, what, " cannot start on rank ", rank(),
               ": the NCCL communicator was aborted earlier: ", failure);
  DeviceScope scope(device_);
  auto* impl = cuda_impl();
  c10::Stream current = impl->getStream(c10::Device(c10::DeviceType::CUDA, device_));
  // The collective's inputs are produced on the caller's stream: wait for them there.
  void* ready = nullptr;
  impl->record(&ready, current, device_, c10::EventFlag::PYTORCH_DEFAULT);
  check_cuda(cudaStreamWaitEvent(impl_->stream, static_cast<cudaEvent_t>(ready), 0), "cudaStreamWaitEvent");
  impl->destroyEvent(ready, device_);  // released once recorded work completes

  check_nccl(enqueue(impl_->comm, impl_->stream), what.c_str());
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventRecord(done, impl_->stream), "cudaEventRecord");
  auto work = std::make_shared<NcclWork>(this, std::move(what), std::move(keep_alive), done, diagnosis_for(seq, op_name));
  {
    std::lock_guard<std::mutex> lock(mu_);
    inflight_.push_back(work);
  }
  cv_.notify_all();
  return work;
}

void NcclCommunicator::watchdog_loop() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (!failure_.empty()) continue;
    ncclResult_t async = ncclSuccess;
    if (impl_->comm != nullptr && ncclCommGetAsyncError(impl_->comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      std::string reason = detail::cat("NCCL reported an asynchronous error on rank ", rank(), ": ",
                                       ncclGetErrorString(async), ". A peer may have exited or the network failed.");
      lock.unlock();
      abort(reason);
      lock.lock();
      continue;
    }
    // Completed works release their tensors; the oldest pending one is checked against the timeout.
    while (!inflight_.empty() && inflight_.front()->is_completed()) inflight_.pop_front();
    if (!inflight_.empty() && Clock::now() - inflight_.front()->start_ > timeout()) {
      std::string reason = detail::cat(inflight_.front()->what_, " did not complete within ", timeout().count() / 1000.0,
                                       " s on rank ", rank(), ": a peer rank did not take part or stalled.");
      lock.unlock();
      abort(reason);
      lock.lock();
    }
  }
}

std::shared_ptr<Work> NcclCommunicator::allreduce(const at::Tensor& tensor, ReduceOp op) {
  check_input(tensor, "the tensor", "all_reduce", &op);
  auto dtype = to_nccl(tensor);
  return launch("allreduce", next_seq(), tensor, &op, {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dtype, to_nccl(op), comm, stream);
  });
}

std::shared_ptr<Work> NcclCommunicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_input(output, "the output", "reduce_scatter", &op);
  check_input(input, "the input", "reduce_scatter", &op);
  check_flat_sizes(input, output, "reduce_scatter");
  auto dtype = to_nccl(input);
  return launch("reduce_scatter", next_seq(), input, &op, {output, input},
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), dtype, to_nccl(op),
                                           comm, stream);
                });
}

std::shared_ptr<Work> NcclCommunicator::all_gather(const at::Tensor& output, const at::Tensor& input) {
  check_input(output, "the output", "all_gather");
  check_input(input, "the input", "all_gather");
  check_flat_sizes(output, input, "all_gather");
  auto dtype = to_nccl(input);
  return launch("all_gather", next_seq(), input, nullptr, {output, input},
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), dtype, comm, stream);
                });
}

std::shared_ptr<Work> NcclCommunicator::broadcast(const at::Tensor& tensor, int root) {
  check_input(tensor, "the tensor", "broadcast");
  check_root(root);
  auto dtype = to_nccl(tensor);
  return launch("broadcast", next_seq(), tensor, nullptr, {tensor},
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dtype, root, comm, stream);
                });
}

std::shared_ptr<Work> NcclCommunicator::barrier() {
  // NCCL has no barrier: a one-element allreduce on the comm stream is one.
  at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(c10::Device(c10::DeviceType::CUDA, device_)));
  return launch("barrier", next_seq(), at::Tensor(), nullptr, {token},
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm, stream);
                });
}

std::string nccl_runtime_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return detail::cat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace dtcore

#endif  // DTCORE_WITH_NCCL
