// Communicator: the one interface dtcore's collectives go through, whatever the engine.
//
// Implementations: GlooCommunicator (CPU tensors, the Gloo inside libtorch) and
// NcclCommunicator (CUDA tensors, dtcore's own NCCL communicator, only when built with NCCL).
// Every collective is asynchronous and returns a Work; Work::wait() blocks with a timeout and
// turns any failure (timeout, dead peer, engine error) into a CommError that names the
// operation, its sequence number and this rank.
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
#include <string>
#include <string_view>

#include <ATen/core/Tensor.h>

#include "dtcore/comm/health.h"

namespace dtcore {

enum class ReduceOp { Sum, Avg, Max, Min };

// Parses "sum" | "avg" | "max" | "min"; ConfigError otherwise.
ReduceOp parse_reduce_op(std::string_view name);
std::string_view reduce_op_name(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective is done and its result usable by the caller (on GPU: on the
  // caller's current stream). Throws CommError on failure, or when `timeout` passes first.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // True once the collective has finished, successfully or not (wait() then returns or raises
  // at once). Never blocks.
  virtual bool is_completed() = 0;
};

class Communicator {
 public:
  Communicator(int rank, int size, std::chrono::milliseconds timeout) : rank_(rank), size_(size), timeout_(timeout) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual std::string_view backend() const = 0;  // "gloo" | "nccl"
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The default for Work::wait() and the engine's own operation timeout.
  std::chrono::milliseconds timeout() const { return timeout_; }

  // With a monitor, every collective records its sequence number there, and a failure's
  // message names the dead or stalled ranks. Set once, before the first collective.
  void set_health(std::shared_ptr<HealthMonitor> health) { health_ = std::move(health); }

  // In place: every rank's `tensor` becomes the reduction over ranks.
  virtual std::shared_ptr<Work> allreduce(const at::Tensor& tensor, ReduceOp op) = 0;
  // input has size() * output.numel() elements; rank r receives the reduction of chunk r.
  virtual std::shared_ptr<Work> reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) = 0;
  // output has size() * input.numel() elements; chunk r is rank r's input.
  virtual std::shared_ptr<Work> all_gather(const at::Tensor& output, const at::Tensor& input) = 0;
  // In place from `root` to everyone.
  virtual std::shared_ptr<Work> broadcast(const at::Tensor& tensor, int root) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // Releases the engine (connections, streams, threads), waiting at most timeout() for work in
  // flight. Idempotent; later collectives raise CommError. dtcore.shutdown() calls it, so that a
  // Context the user still holds keeps nothing alive.
  virtual void close() = 0;

 protected:
  // ConfigError unless `t` suits this communicator (device type, contiguity, dtype for `op`).
  void check_input(const at::Tensor& t, std::string_view what, std::string_view op_name,
                   const ReduceOp* op = nullptr) const;
  void check_flat_sizes(const at::Tensor& big, const at::Tensor& small, std::string_view op_name) const;
  void check_root(int root) const;
  // "allreduce #12 (float32[4096], avg)": the name errors and timeout messages use.
  std::string describe(std::string_view op_name, uint64_t seq, const at::Tensor& t, const ReduceOp* op) const;
  uint64_t next_seq() {
    uint64_t seq = seq_.fetch_add(1) + 1;
    if (health_) health_->record_progress(seq);
    return seq;
  }
  // What the health monitor will say about collective `seq` failing ("" without a monitor).
  // Calling the result blocks for about two heartbeat intervals: only on the failure path.
  // It holds the monitor, not the communicator, so a Work may outlive its communicator.
  std::function<std::string()> diagnosis_for(uint64_t seq, std::string_view op_name) const {
    return [health = health_, seq, name = std::string(op_name)] {
      return health ? health->diagnose(seq, name) : std::string();
    };
  }
  // The device type this communicator's tensors must live on.
  virtual bool accepts_device(const at::Tensor& t) const = 0;

 private:
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> seq_{0};
  std::shared_ptr<HealthMonitor> health_;
};

}  // namespace dtcore
