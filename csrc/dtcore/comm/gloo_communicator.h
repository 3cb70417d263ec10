// GlooCommunicator: dtcore's collectives on CPU tensors, through the Gloo inside libtorch.
//
// torch's wheel ships Gloo's library but not its headers, so the Gloo process group is created
// on the Python side (torch.distributed.ProcessGroupGloo, on dtcore's rendezvous store) and
// handed over as a c10d::Backend; this class drives it through that interface. Gloo runs each
// collective on its own worker threads, so calls return at once and overlap with the caller.
// Gloo has no average: Avg is a sum divided by the world size when the Work completes.
//
// Every collective is checked against the other ranks' before its data moves (unless
// CollectiveCheck::kNever): Gloo kills a process whose peer sends a buffer of another size (an
// exception in its transport thread, which no caller can catch), and reduces same-sized buffers
// of another dtype or op into a wrong result, silently. See Note [Collective signature]. A
// submitter thread takes the collectives in issue order and, for each, runs the check (an
// allreduce of the signatures) and then the collective itself: the caller never waits for the
// check, and every rank hands Gloo the same sequence of calls, which Gloo's message tags need. A
// mismatch fails that collective and every later one, on every rank, naming each rank's call.
// Under kNever the heartbeat's comparison still finds a mismatch, after it ran: a wait polls the
// health monitor's finding while Gloo works, and fails with it.
//
// Ranks on one host exchange through shared memory instead (ShmExchange, DTCORE_SHM): the submitter
// runs each collective there itself, in issue order, with the ranks' signatures compared in the
// segment at no cost (no check allreduce through Gloo), whatever CollectiveCheck says. Reductions
// of dtypes the host kernels do not reduce (bool, complex) still go through Gloo, after a step
// through the segment that compares the signatures.
//
// Ownership: holds a reference to the backend and owns the submitter thread; a Work holds only
// its own state and may outlive the communicator. Thread safety: see communicator.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dtcore/comm/communicator.h"
#include "dtcore/comm/shm_exchange.h"

namespace dtcore {

class GlooWork;  // a collective on its way through the check to Gloo

// What a reduce-scatter leaves to reduce once Gloo has moved the shards: See Note [Reduce-scatter
// on Gloo] in gloo_communicator.cpp.
struct GlooScatter {
  bool into_output = false;  // 2 ranks: the peer's shard was received into the output itself,
  at::Tensor own;            // (shard,) and this rank's own shard of its input joins it there
  at::Tensor received;       // else (N, shard): every rank's shard of ours, own included
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::Backend> backend, const Options& options);
  GlooCommunicator(c10::intrusive_ptr<c10d::Backend> backend, std::chrono::milliseconds timeout)
      : GlooCommunicator(std::move(backend), Options::with_timeout(timeout)) {}
  ~GlooCommunicator() override;  // close()

  std::string_view backend() const override { return "gloo"; }
  // Stops the submitter (collectives not yet handed to Gloo fail as closed) and drops the
  // backend. Idempotent.
  void close() override;
  // The c10d process group this communicator drives (its options, such as Gloo's thread count,
  // are reported in torch DDP's logging data); null once closed.
  c10::intrusive_ptr<c10d::Backend> engine();
  // Whether the ranks exchange through shared memory (See shm_exchange.h); set at construction.
  bool shared_memory() const { return shared_memory_; }
  at::Tensor shared_buffer(int64_t bytes) override;
  bool offers_shared_buffers() const override { return shared_memory_; }

 protected:
  std::shared_ptr<Work> start(const Collective& c) override;
  bool accepts_device(const at::Tensor& t) const override { return t.device().is_cpu(); }

 private:
  void submit_loop();
  // The ranks' signatures for `c` agree: "" when they do, else the message naming each call.
  std::string check_against_peers(const c10::intrusive_ptr<c10d::Backend>& backend, const Collective& c);
  // Hands `c` to Gloo. A reduce-scatter runs as an all-to-all of the shards, which `scatter` says
  // how to reduce into the output when the work completes: See Note [Reduce-scatter on Gloo] in
  // gloo_communicator.cpp.
  c10::intrusive_ptr<c10d::Work> launch(const c10::intrusive_ptr<c10d::Backend>& backend, const Collective& c,
                                        GlooScatter& scatter);
  // Runs `c` through shared memory, in this (the submitter's) thread, and completes `work`.
  void run_shared(std::shared_ptr<GlooWork> work);
  // What stops `c`'s waits in shared memory: close(), or the heartbeat's finding of a mismatch.
  ShmExchange::Interrupt interrupt_for(const Collective& c);

  bool shared_memory_ = false;           // shm_ was made: set before the submitter starts, never changed
  std::unique_ptr<ShmExchange> shm_;     // null: everything through Gloo; used by the submitter only
  std::shared_ptr<ShmBuffers> buffers_;  // shm_'s, for shared_buffer(); set with it
  std::atomic<bool> closing_{false};     // close() began: a collective in shared memory stops waiting

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  c10::intrusive_ptr<c10d::Backend> backend_;    // null once closed
  std::deque<std::shared_ptr<GlooWork>> queue_;  // issued, not yet handed to Gloo
  std::string failure_;  // set by the first mismatch or broken check: every later collective fails with it
  bool stop_ = false;
  std::thread submitter_;  // last: started once the rest is ready
};

}  // namespace dtcore
