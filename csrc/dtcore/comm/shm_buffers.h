// ShmBuffers: memory that every rank of a shared-memory exchange maps, so that a collective on it
// reads the peers' data where they keep it and writes the result straight into every rank's copy.
//
// Through the exchange's slots, an all-reduce copies each rank's tensor into the segment and the
// reduced result back out: at 2 ranks, 4.5 bytes of memory traffic per byte reduced. A tensor
// that lives in a shared buffer needs no copy in either direction: each rank reduces its part of
// every rank's tensor in place and writes it into the others' (2 bytes per byte). The reducer
// allocates its gradient buckets here (Communicator::shared_buffer), which makes its collectives,
// the bulk of a step's, cheaper. See Note [Buffers in shared memory] in shm_buffers.cpp.
//
// Thread safety: allocate() is a collective of the communicator, called on the caller's thread (the
// reducer's: the thread that ends a backward); find() may run at the same time on the
// communicator's submitter.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dtcore {

class Communicator;

class ShmBuffers {
 public:
  // One buffer's mapping, holding every rank's copy: rank r's at base + r * region.
  struct Pool {
    Pool(char* base, int64_t region, int size) : base(base), region(region), size(size) {}
    ~Pool();  // unmaps it
    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;
    uint32_t id = 0;  // set once every rank mapped it; alike on every rank (allocated in the same order)
    char* const base;
    const int64_t region;
    const int size;
  };
  // Where a tensor's bytes are in a buffer, and the same bytes of each rank's copy.
  struct Place {
    std::shared_ptr<Pool> pool;  // kept alive while a collective uses it
    int64_t offset = 0;          // from the start of this rank's copy
    char* at(int rank) const { return pool->base + rank * pool->region + offset; }
  };

  ShmBuffers(int rank, int size) : rank_(rank), size_(size) {}

  // A uint8 tensor of `bytes`, zeroed, in a buffer every rank of `comm` maps; undefined when one
  // of them could not map it (a full /dev/shm: the log names the ranks and says why), in which case
  // the caller allocates ordinary memory. A collective: every rank calls it with the same size, in
  // the same order as its other collectives. The memory is freed when the last tensor viewing it
  // goes.
  at::Tensor allocate(Communicator& comm, int64_t bytes);

  // The place of `bytes` bytes at `data` when they lie within one of this rank's buffers.
  std::optional<Place> find(const void* data, int64_t bytes) const;

 private:
  const int rank_;
  const int size_;
  mutable std::mutex mu_;  // guards the members below
  std::vector<std::weak_ptr<Pool>> pools_;
  uint32_t next_id_ = 1;  // 0 stands for "not in a buffer" in the exchange's headers
};

}  // namespace dtcore
