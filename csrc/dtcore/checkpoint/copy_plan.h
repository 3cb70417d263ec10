// CopyPlan: the byte copies of an in-memory checkpoint (Note [In-memory checkpoints],
// python/dtcore/checkpoint/memory.py), laid out once and run at every save.
//
// A save copies a rank's state (a hundred tensors or so, many of them small) into the mapped
// file of its slot. Through torch (_foreach_copy_ on CPU: one copy_ per tensor) that costs about
// 0.6 us of dispatch per tensor, twice the time of copying the bytes themselves on a small model
// taken every step; here a CPU pair is one memcpy. The plan holds its tensors (views of the live
// state and of the mapping), so their memory stays valid while it exists; whether they are still
// the state's tensors is the caller's check (memory.py's _Watch), before each run().
//
// The sources' addresses are taken once, at construction: a save runs right after a step's compute,
// when the tensors' own structures are out of the cache, and reading a hundred of them cost as much
// as the copy (tens of microseconds on a small model). At each run() only each source's storage is
// read again, to check that it still has the address and size it had (a storage resized since, as a
// parameter freed and allocated anew, is an error: never a read of freed memory).
//
// Pairs: destination i receives source i for every source given to the constructor; the
// destinations after those receive, in order, the tensors given to run() (what is taken anew at
// every save: RNG states, a non-contiguous tensor flattened). A destination is a contiguous CPU
// byte tensor; a source is any contiguous tensor of the same size in bytes (its bytes are copied,
// whatever their dtype), on the CPU (a memcpy) or a GPU (a device-to-host copy_, which returns
// once the bytes are on the host).
//
// Errors: CheckpointError naming the pair, at construction and for run()'s tensors.
// Thread safety: run() may be called from any thread, one at a time; the GIL is not needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dtcore::checkpoint {

class CopyPlan {
 public:
  CopyPlan(std::vector<at::Tensor> destinations, std::vector<at::Tensor> sources);

  // Copies every source into its destination, then `tail` into the destinations left.
  void run(const std::vector<at::Tensor>& tail) const;

  // The destinations that run() fills from its `tail`.
  std::size_t tail_size() const { return destinations_.size() - sources_.size(); }
  // Bytes one run() copies.
  std::size_t bytes() const;

 private:
  static void copy(const at::Tensor& destination, const at::Tensor& source, std::size_t index);

  std::vector<at::Tensor> destinations_;
  std::vector<at::Tensor> sources_;
  struct Span {  // a CPU source's copy, as laid out
    std::uint8_t* to;
    const std::uint8_t* from;
    std::size_t bytes;
    const c10::StorageImpl* storage;  // the source's (kept alive by sources_)
    const void* base;                 // storage->data() and storage->nbytes() when laid out
    std::size_t storage_bytes;
  };
  std::vector<Span> spans_;                  // one per CPU source (GPU sources go through copy())
  std::vector<std::size_t> device_sources_;  // the indices of the others
};

}  // namespace dtcore::checkpoint
