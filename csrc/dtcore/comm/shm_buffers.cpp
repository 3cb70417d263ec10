#include "dtcore/comm/shm_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "dtcore/comm/communicator.h"
#include "dtcore/comm/shm_exchange.h"
#include "dtcore/common/error.h"
#include "dtcore/common/log.h"
#include "dtcore/common/units.h"

namespace dtcore {

// Note [Buffers in shared memory]
// A buffer is one segment of size * region bytes, region being the bytes asked for rounded up to
// a page; rank r's copy is at r * region, and every rank maps the whole segment. allocate() is
// a collective of the communicator: rank 0 creates the segment (reserved in /dev/shm, so a full
// one is refused here rather than SIGBUS later) and broadcasts its name; the others map it; an
// all-gather tells every rank whether all did; rank 0 then unlinks the name, on every way out, so
// nothing is left in /dev/shm (the mappings live on). Either every rank gets its buffer or none
// does (rank 0's log names the ranks that could not, each of them why), and a buffer's id,
// counted on success, is alike on every rank.
//
// An all-reduce of a tensor in a buffer (ShmExchange::all_reduce) runs as one step of the
// exchange's protocol whose headers say where each rank's tensor lies (the buffer's id and the
// offset): when every rank's does, at the same place, rank p reduces part p of all the ranks'
// copies, in place, and writes it into the others'; once every rank has, each holds the whole
// result. Otherwise the ranks go on through the slots, as for any tensor, so a tensor that is in a
// buffer on some ranks only is still reduced right. The first chunk is copied into the slots before
// the headers are compared (every rank must have its data there should one rank's tensor not be in
// the buffer): half a slot at 2 ranks, the price of that choice. Liveness and timeouts are the
// exchange's: a rank that exits lets go of the exchange's segment, not of the buffers it mapped.
// After a failure the exchange is unusable (shm_exchange.h), and one more thing holds here: a
// rank that timed out or was interrupted may still have its tensor written by a late peer that
// found every header offering the same place, until that peer fails in turn. The failed rank's
// gradients are then not reduced anyway, and its communicator refuses every later collective.
// A process forked from a rank (a DataLoader worker) shares the buffers: what it writes into them
// the rank sees, which a private copy-on-write page would not show. The reducer keeps gradients
// there; a worker has no reason to write them.

ShmBuffers::Pool::~Pool() { munmap(base, static_cast<size_t>(region * size)); }

at::Tensor ShmBuffers::allocate(Communicator& comm, int64_t bytes) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t most = (std::numeric_limits<int64_t>::max() - page) / size_;
  DTCORE_CHECK(bytes >= 0 && bytes <= most, ConfigError, "a shared buffer of ", bytes,
               " bytes cannot be allocated. Fix: ask for 0 to ", most, " bytes.");
  const int64_t region = std::max<int64_t>(page, (bytes + page - 1) / page * page);
  const int64_t total = region * size_;

  std::string why;             // this rank's reason for not mapping it
  std::shared_ptr<Pool> pool;  // unmaps it on any way out
  auto map = [&](int fd) {
    if (void* base = ShmExchange::map_segment(fd, total, why)) {
      pool = std::make_shared<Pool>(static_cast<char*>(base), region, size_);
    }
    close(fd);  // the mapping keeps the memory
  };
  ShmExchange::UnlinkOnExit unlink_name;  // rank 0's, once every rank has mapped it or given up
  at::Tensor name = at::zeros({ShmExchange::kNameBytes}, at::kByte);
  if (rank_ == 0) {
    const std::string n = ShmExchange::unique_name("buffer");
    if (const int fd = ShmExchange::create_segment(n, total, why); fd >= 0) {
      unlink_name.name = n;
      map(fd);
      if (pool) std::memcpy(name.data_ptr(), n.data(), n.size());
    }
  }
  comm.broadcast(name, 0, "shared buffer")->wait();
  if (rank_ != 0) {
    const std::string n(static_cast<const char*>(name.data_ptr()));
    if (n.empty()) {
      why = "rank 0 could not create it";
    } else if (const int fd = ShmExchange::open_segment(n, total, why); fd >= 0) {
      map(fd);
    }
  }
  // Every rank learns which could not map it.
  at::Tensor failed = at::empty({size_}, at::kInt);
  comm.all_gather(failed, at::full({1}, pool ? 0 : 1, at::kInt), "shared buffer")->wait();
  unlink_name.now();
  std::string ranks;
  for (int r = 0; r < size_; ++r) {
    if (failed.data_ptr<int32_t>()[r] != 0) ranks += detail::cat(ranks.empty() ? "" : ", ", comm.job_rank(r));
  }
  if (!ranks.empty()) {
    if (!why.empty()) log::info("this rank cannot map a buffer in shared memory: ", why);
    if (rank_ == 0) {
      log::info("a buffer of ", format_bytes(bytes), " in shared memory could not be mapped on rank(s) ", ranks,
                ": its collectives copy through the exchange instead");
    }
    return {};
  }
  std::lock_guard<std::mutex> lock(mu_);
  pool->id = next_id_++;
  std::erase_if(pools_, [](const std::weak_ptr<Pool>& p) { return p.expired(); });
  pools_.push_back(pool);
  return at::from_blob(pool->base + rank_ * region, {bytes}, [pool](void*) {}, at::TensorOptions().dtype(at::kByte));
}

std::optional<ShmBuffers::Place> ShmBuffers::find(const void* data, int64_t bytes) const {
  const char* p = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& weak : pools_) {
    auto pool = weak.lock();
    if (!pool) continue;
    const char* mine = pool->base + rank_ * pool->region;
    if (p >= mine && p + bytes <= mine + pool->region) return Place{std::move(pool), p - mine};
  }
  return std::nullopt;
}

}  // namespace dtcore
