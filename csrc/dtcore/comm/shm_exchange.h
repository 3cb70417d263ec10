// ShmExchange: the collectives of ranks that share one host, through one shared-memory segment.
//
// Over loopback, Gloo moves every byte through the kernel's socket buffers on both ends, and that
// copying is CPU time the ranks' compute cannot hide on a busy host. Ranks on one host can instead
// exchange through memory they all map: each byte is copied into the segment once and read out
// once, with no system call on the data path. GlooCommunicator runs its collectives here when
// every rank of the communicator could map the segment (DTCORE_SHM), and through Gloo otherwise.
// See Note [Collectives through shared memory] in shm_exchange.cpp for the protocol.
//
// Failures: every wait has the communicator's timeout and names the ranks that did not arrive
// (and the collective each last issued); a rank whose process exits is seen within 100 ms (the
// lock it holds on the segment is gone), and so is an interruption the caller asks for (a closed
// communicator, a mismatch the heartbeat found). After any failure the segment's state is unknown:
// the caller must not run another collective through it.
//
// Thread safety: run() is called from one thread at a time (the communicator's submitter).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dtcore/comm/communicator.h"
#include "dtcore/comm/shm_buffers.h"

namespace dtcore {

// A collective's ranks called different collectives (their signatures differ at it): the
// communicator turns it into the message naming each rank's call.
class ShmMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether `value` is the same on every rank of `backend`'s group: one allreduce through Gloo,
// waited for at most `timeout` (c10d's error when it passes). Ignores the value's lowest bit.
bool same_on_every_rank(const c10::intrusive_ptr<c10d::Backend>& backend, uint64_t value,
                        std::chrono::milliseconds timeout);

class ShmExchange {
 public:
  // What run() polls while it waits, every 100 ms: a non-empty answer interrupts the collective
  // with that message (thrown as CommError, whole: it is the caller's final word).
  using Interrupt = std::function<std::string()>;

  // Called on every rank of `backend`'s group alike, before any collective, whatever each rank's
  // `mode` (it runs up to three of Gloo's collectives). Once the ranks are found to share a host
  // (name and boot id), rank 0 creates the segment and names it to the others; each maps it and takes its lock; then
  // every rank learns whether all succeeded, and rank 0 unlinks the name (the mapping lives on until the last rank
  // unmaps it). Null when the ranks do not all map it (or one rank alone): the log says which ranks and why.
  // `job_ranks` names the members in messages (empty: rank r is job rank r).
  static std::unique_ptr<ShmExchange> connect(const c10::intrusive_ptr<c10d::Backend>& backend, SharedMemory mode,
                                              std::chrono::milliseconds timeout, std::vector<int> job_ranks);
  // connect()'s parts, on one rank each (a test runs them in threads): rank 0 creates the segment
  // `name` (a POSIX shared-memory name, "/..."), the others open it; both map it and take their
  // lock. Null on failure, with `why` saying what failed; nothing is left behind but the name,
  // which unlink() removes (the mapping lives on until the last rank unmaps it).
  static std::unique_ptr<ShmExchange> create(const std::string& name, int size, std::chrono::milliseconds timeout,
                                             std::vector<int> job_ranks, std::string& why);
  static std::unique_ptr<ShmExchange> open(const std::string& name, int rank, int size,
                                           std::chrono::milliseconds timeout, std::vector<int> job_ranks,
                                           std::string& why);
  static void unlink(const std::string& name);

  // The segments' parts, for ShmBuffers too. Rank 0 hands a segment's name out in kNameBytes
  // bytes, NUL-padded.
  static constexpr int64_t kNameBytes = 64;
  // The name of a segment rank 0 created: unlinked by now(), or on any way out (the mappings live on).
  struct UnlinkOnExit {
    std::string name;  // empty: nothing to unlink
    ~UnlinkOnExit() { now(); }
    void now() {
      if (!name.empty()) unlink(std::exchange(name, std::string()));
    }
  };
  // A fresh POSIX shared-memory name for `what`.
  static std::string unique_name(std::string_view what);
  // Creates the segment `name` of `bytes`, all of them reserved in /dev/shm (zeroed): its file
  // descriptor, or -1 with `why` said and nothing left behind.
  static int create_segment(const std::string& name, int64_t bytes, std::string& why);
  // Opens another rank's segment `name`, which must hold `bytes`: -1 with `why` on failure.
  static int open_segment(const std::string& name, int64_t bytes, std::string& why);
  // Maps all of it, shared; null with `why` on failure.
  static void* map_segment(int fd, int64_t bytes, std::string& why);

  ~ShmExchange();  // unmaps the segment and lets go of this rank's lock
  ShmExchange(const ShmExchange&) = delete;
  ShmExchange& operator=(const ShmExchange&) = delete;

  // Runs `c` to completion on this rank, in the calling thread, within the timeout from now. Avg
  // is divided here. The ranks' signatures are compared in every chunk's headers before any rank
  // reads another's data (ShmMismatch when they differ), at no cost. Throws std::runtime_error
  // when a peer times out or exits, CommError when `interrupt` answers.
  void run(const Collective& c, const Interrupt& interrupt);
  // The signature check alone, for a collective that goes through Gloo (one step through the
  // segment that moves no data): the ranks are in step before Gloo runs it.
  void check(const Collective& c, const Interrupt& interrupt);

  // Whether `c` can run here: every collective can, except reductions of dtypes the host
  // kernels do not reduce (bool, complex): those take Gloo. Depends only on what the collective
  // signature covers, so every rank decides alike.
  static bool supports(const Collective& c);

  int64_t segment_bytes() const { return bytes_; }
  // The buffers every rank maps (See shm_buffers.h): an all-reduce of a tensor in one of them runs
  // in place, with no copy through the slots.
  const std::shared_ptr<ShmBuffers>& buffers() const { return buffers_; }

 private:
  struct Layout;
  ShmExchange(int rank, int size, std::vector<int> job_ranks, std::chrono::milliseconds timeout, int fd, void* base,
              int64_t bytes);

  class Chunk;                      // one step of the protocol, See Note [Collectives through shared memory]
  void begin(const Collective& c);  // this rank is in `c`, whose timeout starts now
  void all_reduce(const Collective& c, const Interrupt& interrupt);
  // The rest of an all-reduce whose first chunk found every rank's tensor at `place`.
  void all_reduce_in_place(const Collective& c, const ShmBuffers::Place& place, Chunk& chunk);
  void reduce_scatter(const Collective& c, const Interrupt& interrupt);
  void all_gather(const Collective& c, const Interrupt& interrupt);
  void broadcast(const Collective& c, const Interrupt& interrupt);

  // Waits until every rank's counter reaches `target`.
  void wait_for_ranks(uint32_t target, const Collective& c, const Interrupt& interrupt);
  void arrive(uint32_t value);
  struct Control;  // a rank's line of the control page
  Control* control(int r) const;
  // Takes this rank's lock on the segment (See Note [Collectives through shared memory]).
  bool lock(std::string& why);
  // Whether rank `r`'s process still holds its lock on the segment.
  bool alive(int r) const;
  int job_rank(int r) const { return job_ranks_.empty() ? r : job_ranks_[static_cast<size_t>(r)]; }

  const int rank_;
  const int size_;
  const std::vector<int> job_ranks_;
  const std::chrono::milliseconds timeout_;
  const int fd_;
  char* const base_;
  const int64_t bytes_;
  uint32_t chunk_ = 0;                              // the protocol's next chunk number, alike on every rank
  std::chrono::steady_clock::time_point deadline_;  // of the collective running
  const std::shared_ptr<ShmBuffers> buffers_;
};

}  // namespace dtcore
