#include "dtcore/comm/shm_exchange.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <utility>

#include "dtcore/comm/host_reduce.h"
#include "dtcore/common/c10_error.h"
#include "dtcore/common/env.h"
#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/log.h"

namespace dtcore {

// Note [Collectives through shared memory]
// The segment holds, after a control page (one cache line per rank: a chunk counter, the number
// of its waiters, the collective it is in), two buffers; each has one slot per rank (a header
// line and kSlotBytes of data) and a result area of kSlotBytes. A collective runs as chunks of at
// most kSlotBytes per slot; chunk t (numbered across collectives, alike on every rank) uses
// buffer t % 2, and each rank's counter goes 2t+1 when it has written its slot and 2t+2 when it
// has reduced its part:
//   1. wait until every counter >= 2t-1 (every rank has finished reading buffer t % 2 for chunk
//      t-2, since it has begun chunk t-1)
//   2. write the header (the collective's signature and number) and the data others need into
//      this rank's slot; counter := 2t+1; wait until every counter >= 2t+1; compare the headers:
//      the ranks are in the same collective, so they take the same chunks. An all-reduce's first
//      header also says where its tensor lies when that is in a shared buffer: when every rank's
//      is at the same place, the rest runs in place (Note [Buffers in shared memory])
//   3. reduce this rank's part from its own tensor and the others' slots
//   4. all_gather and broadcast read the others' slots now; counter := 2t+2
//   5. all_reduce waits until every counter >= 2t+2 and copies the reduced chunk out
// All-reduce: rank p reduces part p of each chunk (1/N of it) into the result area, so that
// every part is reduced once, by one rank, and all ranks get the same bits. Every element is
// reduced in rank order (rank 0's value first, whichever rank reduces it), so its bits do not
// depend on which part it falls in either: a bucket layout or chunking of another run gives the
// same sums (a ring, Gloo's or NCCL's, adds in an order that depends on the element's position,
// and differs from run to run once the layout does). A rank copies in only the parts the others
// reduce. Reduce-scatter: each rank copies in the shards of the others
// and reduces its own shard straight into its output (no copy out). Per rank and byte of an
// all-reduce at 2 ranks: half a byte copied in, one byte read to reduce, half written, one byte
// copied out; Gloo over loopback copies each byte through two socket buffers, in the kernel.
// Waiting: a rank spins briefly on a counter, then sleeps on it (futex) in slices of 100 ms,
// after each of which it checks the interrupt, the peer's lock (a rank that exited releases it:
// an open-file-description lock on byte r of the segment, held by rank r) and the timeout. A
// rank wakes sleepers only when there are some, so the data path makes no system call. A process
// forked from a rank (a DataLoader worker) shares its lock: a rank that exits is then seen exited
// once its children have gone too (DataLoader's workers follow their parent within seconds), and at
// worst at the timeout.

namespace {

constexpr int64_t kSlotBytes = int64_t{1} << 20;    // per rank and buffer, the most a chunk moves
constexpr int64_t kBlockBytes = int64_t{64} << 10;  // reduced at a time in place (in a shared buffer)
constexpr int64_t kPage = 4096;
constexpr int64_t kLine = 64;
constexpr uint64_t kMagic = 0x31304d4853544400ULL;  // "\0DTSHM01"
constexpr auto kSlice = std::chrono::milliseconds(100);
constexpr int kSpins = 2000;

struct alignas(kLine) SlotHeader {
  uint64_t signature;
  uint64_t seq;
  uint64_t pool;    // an all-reduce's first chunk: the shared buffer its tensor lies in (0: none), and
  uint64_t offset;  // where in it; See Note [Buffers in shared memory]
};

struct alignas(kLine) SegmentHeader {
  uint64_t magic;
  uint64_t size;
  uint64_t slot_bytes;
};

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// Wrap-safe: whether counter `v` has reached `target`.
bool reached(uint32_t v, uint32_t target) { return static_cast<int32_t>(v - target) >= 0; }

long futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

std::string os_error(std::string_view what) { return detail::cat(what, ": ", std::strerror(errno)); }

// This host as its processes see it: its name and its boot (two machines cloned from one image
// share a name, never a boot id), hashed.
uint64_t host_identity() {
  std::string id = host_name();
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char boot[64] = {};
    if (std::fgets(boot, sizeof boot, f) != nullptr) id += boot;
    std::fclose(f);
  }
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char ch : id) hash = (hash ^ ch) * 1099511628211ULL;
  return hash;
}

}  // namespace

struct alignas(kLine) ShmExchange::Control {
  uint32_t counter;   // See Note [Collectives through shared memory]; the futex word
  uint32_t sleepers;  // ranks asleep on `counter`
  uint64_t seq;       // the collective this rank last began, for messages
};

ShmExchange::Control* ShmExchange::control(int r) const { return reinterpret_cast<Control*>(base_ + kLine * (1 + r)); }

struct ShmExchange::Layout {
  int64_t control;  // the control page(s): the segment header, then one Control per rank
  int64_t slot;     // a slot's stride: its header page, then kSlotBytes of data
  int64_t buffer;   // a buffer's stride: size slots, then the result area
  int64_t bytes;

  explicit Layout(int size)
      : control(align_up(kLine * (1 + size), kPage)),
        slot(kPage + kSlotBytes),
        buffer(slot * size + kSlotBytes),
        bytes(control + 2 * buffer) {}
};

bool same_on_every_rank(const c10::intrusive_ptr<c10d::Backend>& backend, uint64_t value,
                        std::chrono::milliseconds timeout) {
  if (backend->getSize() == 1) return true;
  // max(v) == min(v) over the ranks, in one allreduce: [v, -v] with MAX gives [max, -min]. The
  // value is halved so that -v cannot overflow.
  const int64_t v = static_cast<int64_t>(value >> 1);
  at::Tensor t = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  int64_t* p = t.data_ptr<int64_t>();  // no indexing through the dispatcher: it runs per collective
  p[0] = v;
  p[1] = -v;
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  opts.timeout = timeout;
  backend->allreduce(tensors, opts)->wait(timeout);
  return p[0] == -p[1];
}

std::string ShmExchange::unique_name(std::string_view what) {
  std::random_device random;
  return detail::cat("/dtcore-", getpid(), "-", what, "-", std::hex, random(), random());
}

int ShmExchange::create_segment(const std::string& name, int64_t bytes, std::string& why) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = os_error(detail::cat("shm_open(", name, ")"));
    return -1;
  }
  if (ftruncate(fd, bytes) != 0) {
    why = os_error("ftruncate");
  } else if (int err = posix_fallocate(fd, 0, bytes); err != 0) {
    // Reserved now, or a full /dev/shm would kill the process (SIGBUS) at its first touch.
    why = detail::cat("/dev/shm has no room for ", bytes >> 20, " MiB (", std::strerror(err),
                      "); in a container, raise its --shm-size");
  } else {
    return fd;
  }
  close(fd);
  shm_unlink(name.c_str());
  return -1;
}

int ShmExchange::open_segment(const std::string& name, int64_t bytes, std::string& why) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    why =
        os_error(detail::cat("shm_open(", name, ") of rank 0's segment (not the same host, or not the same /dev/shm)"));
    return -1;
  }
  struct stat st{};
  if (fstat(fd, &st) == 0 && st.st_size == bytes) return fd;
  why = detail::cat("the segment ", name, " is not the size this rank expects");
  close(fd);
  return -1;
}

void* ShmExchange::map_segment(int fd, int64_t bytes, std::string& why) {
  void* base = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base != MAP_FAILED) return base;
  why = os_error("mmap");
  return nullptr;
}

std::unique_ptr<ShmExchange> ShmExchange::create(const std::string& name, int size, std::chrono::milliseconds timeout,
                                                 std::vector<int> job_ranks, std::string& why) {
  const Layout layout(size);
  const int fd = create_segment(name, layout.bytes, why);
  if (fd < 0) return nullptr;
  void* base = map_segment(fd, layout.bytes, why);
  if (base == nullptr) {
    close(fd);
    shm_unlink(name.c_str());
    return nullptr;
  }
  auto* header = static_cast<SegmentHeader*>(base);  // read by the others once they have the name
  header->size = static_cast<uint64_t>(size);
  header->slot_bytes = static_cast<uint64_t>(kSlotBytes);
  header->magic = kMagic;
  auto x =
      std::unique_ptr<ShmExchange>(new ShmExchange(0, size, std::move(job_ranks), timeout, fd, base, layout.bytes));
  if (!x->lock(why)) {
    x.reset();
    shm_unlink(name.c_str());
  }
  return x;
}

std::unique_ptr<ShmExchange> ShmExchange::open(const std::string& name, int rank, int size,
                                               std::chrono::milliseconds timeout, std::vector<int> job_ranks,
                                               std::string& why) {
  const Layout layout(size);
  const int fd = open_segment(name, layout.bytes, why);
  if (fd < 0) return nullptr;
  void* base = map_segment(fd, layout.bytes, why);
  if (base != nullptr) {
    if (const auto* header = static_cast<const SegmentHeader*>(base);
        header->magic != kMagic || header->size != static_cast<uint64_t>(size) ||
        header->slot_bytes != static_cast<uint64_t>(kSlotBytes)) {
      why = detail::cat("the segment ", name, " was not written by this job's rank 0 (another dtcore version?)");
      munmap(base, static_cast<size_t>(layout.bytes));
      base = nullptr;
    }
  }
  if (base == nullptr) {
    close(fd);
    return nullptr;
  }
  auto x =
      std::unique_ptr<ShmExchange>(new ShmExchange(rank, size, std::move(job_ranks), timeout, fd, base, layout.bytes));
  if (!x->lock(why)) x.reset();
  return x;
}

void ShmExchange::unlink(const std::string& name) { shm_unlink(name.c_str()); }

bool ShmExchange::lock(std::string& why) {
  struct flock lock{};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = rank_;
  lock.l_len = 1;
  if (fcntl(fd_, F_OFD_SETLK, &lock) == 0) return true;
  why = os_error("locking the segment");
  return false;
}

std::unique_ptr<ShmExchange> ShmExchange::connect(const c10::intrusive_ptr<c10d::Backend>& backend, SharedMemory mode,
                                                  std::chrono::milliseconds timeout, std::vector<int> job_ranks) {
  const int rank = backend->getRank(), size = backend->getSize();
  if (size == 1) return nullptr;
  // Every rank takes part, whatever its DTCORE_SHM says: a rank that skipped the collectives
  // below would leave the others' out of step with its own.
  const bool off = mode == SharedMemory::kOff;

  // First, whether the ranks share a host at all: rank 0 reserves no memory for a job of several.
  if (!same_on_every_rank(backend, host_identity(), timeout)) {
    DTCORE_CHECK(mode != SharedMemory::kRequired, ConfigError, knobs::kShm.name,
                 "=1, but the ranks are on several hosts, which cannot share memory. Fix: unset ", knobs::kShm.name,
                 " to let them go through Gloo.");
    log::debug("the ranks are on several hosts: collectives go through Gloo");
    return nullptr;
  }

  // Rank 0 creates the segment under a random name and hands the name out ("" when it did not).
  std::string why;  // this rank's reason for not mapping it
  std::unique_ptr<ShmExchange> x;
  at::Tensor name = at::zeros({kNameBytes}, at::kByte);
  UnlinkOnExit unlink_name;  // once every rank has mapped it or given up
  if (rank == 0 && !off) {
    const std::string n = unique_name("exchange");
    x = create(n, size, timeout, job_ranks, why);
    if (x) {
      std::memcpy(name.data_ptr(), n.data(), n.size());
      unlink_name.name = n;
    }
  }
  std::vector<at::Tensor> named{name};
  c10d::BroadcastOptions bopts;
  bopts.rootRank = 0;
  bopts.timeout = timeout;
  backend->broadcast(named, bopts)->wait(timeout);
  const std::string segment(static_cast<const char*>(name.data_ptr()));
  if (rank != 0 && !off) {
    if (segment.empty()) {
      why = "rank 0 did not create the segment";
    } else {
      x = open(segment, rank, size, timeout, job_ranks, why);
    }
  }

  // Every rank learns each one's state, a sum of one-hot entries: 0 mapped, 1 failed, 2 off.
  constexpr int32_t kMapped = 0, kFailed = 1, kOffHere = 2;
  at::Tensor states = at::zeros({size}, at::kInt);
  states.data_ptr<int32_t>()[rank] = off ? kOffHere : x ? kMapped : kFailed;
  std::vector<at::Tensor> counted{states};
  c10d::AllreduceOptions aopts;
  aopts.reduceOp = c10d::ReduceOp::SUM;
  aopts.timeout = timeout;
  backend->allreduce(counted, aopts)->wait(timeout);
  unlink_name.now();

  const int32_t* state = states.data_ptr<int32_t>();
  const bool root_off = state[0] == kOffHere;  // then the others failed for want of its segment
  std::string failed, turned_off;
  for (int r = 0; r < size; ++r) {
    if (state[r] == kMapped || (root_off && state[r] == kFailed)) continue;
    std::string& list = state[r] == kFailed ? failed : turned_off;
    list += detail::cat(list.empty() ? "" : ", ", job_ranks.empty() ? r : job_ranks[static_cast<size_t>(r)]);
  }
  if (failed.empty() && turned_off.empty()) {
    log::debug("collectives through shared memory: ", x->bytes_ >> 20, " MiB segment, ", size, " ranks");
    return x;
  }
  x.reset();
  if (!failed.empty() && !why.empty()) {
    log::warn("this rank cannot map the shared-memory segment for collectives: ", why);
  }
  if (failed.empty() && off) return nullptr;  // off here too: nothing to say
  std::string message = failed.empty()
                            ? detail::cat("collectives cannot go through shared memory: ", knobs::kShm.name,
                                          "=0 on rank(s) ", turned_off, " only")
                            : detail::cat("collectives cannot go through shared memory: rank(s) ", failed,
                                          " could not map rank 0's segment",
                                          why.empty() ? std::string() : detail::cat(" (this rank: ", why, ")"));
  DTCORE_CHECK(mode != SharedMemory::kRequired, ConfigError, message, ". Fix: ",
               failed.empty() ? detail::cat("set the same ", knobs::kShm.name, " on every rank")
                              : std::string("run the ranks on one host with a shared /dev/shm that has room"),
               ", or unset ", knobs::kShm.name, "=1 to let them go through Gloo.");
  log::info(message, "; they go through Gloo");
  return nullptr;
}

ShmExchange::ShmExchange(int rank, int size, std::vector<int> job_ranks, std::chrono::milliseconds timeout, int fd,
                         void* base, int64_t bytes)
    : rank_(rank),
      size_(size),
      job_ranks_(std::move(job_ranks)),
      timeout_(timeout),
      fd_(fd),
      base_(static_cast<char*>(base)),
      bytes_(bytes),
      buffers_(std::make_shared<ShmBuffers>(rank, size)) {}

ShmExchange::~ShmExchange() {
  munmap(base_, static_cast<size_t>(bytes_));
  close(fd_);  // releases this rank's lock
}

bool ShmExchange::supports(const Collective& c) {
  if (c.kind == CollectiveKind::AllReduce) return host_reducible(c.input.scalar_type());
  if (c.kind == CollectiveKind::ReduceScatter) return host_reducible(c.output.scalar_type());
  return true;
}

// One chunk of a collective: See Note [Collectives through shared memory].
class ShmExchange::Chunk {
 public:
  Chunk(ShmExchange& x, const Collective& c, const Interrupt& interrupt)
      : x_(x), c_(c), interrupt_(interrupt), t_(x.chunk_++), b_(t_ & 1) {
    const Layout layout(x.size_);
    layout_buffer_ = x.base_ + layout.control + b_ * layout.buffer;
    slot_stride_ = layout.slot;
    result_ = layout_buffer_ + layout.slot * x.size_;
    x_.wait_for_ranks(2 * t_ - 1, c_, interrupt_);  // 1: the buffer is free
    auto* h = header(x_.rank_);
    h->signature = c.signature;
    h->seq = c.seq;
    h->pool = 0;
    h->offset = 0;
  }

  // Before written(): this rank's tensor lies at `place` in a shared buffer.
  void offer(const ShmBuffers::Place& place) {
    header(x_.rank_)->pool = place.pool->id;
    header(x_.rank_)->offset = static_cast<uint64_t>(place.offset);
  }
  // After written(): whether every rank offered the same place.
  bool offered_everywhere() const {
    const SlotHeader* mine = header(x_.rank_);
    for (int r = 0; r < x_.size_; ++r) {
      if (header(r)->pool != mine->pool || header(r)->offset != mine->offset) return false;
    }
    return mine->pool != 0;
  }

  char* slot(int r) const { return layout_buffer_ + r * slot_stride_ + kPage; }
  char* result() const { return result_; }

  // 2: this rank's slot is written; once all are, the headers are compared: every rank is in the
  // same collective (the signature covers its sizes, so all take the same chunks).
  void written() {
    x_.arrive(2 * t_ + 1);
    x_.wait_for_ranks(2 * t_ + 1, c_, interrupt_);
    for (int r = 0; r < x_.size_; ++r) {
      if (header(r)->signature != c_.signature) {
        throw ShmMismatch(detail::cat("rank ", x_.job_rank(r), " called another collective at #", c_.seq));
      }
    }
  }

  // 4: this rank is done with the others' slots (and has reduced its part).
  void reduced() { x_.arrive(2 * t_ + 2); }

  // 5: every rank has reduced its part.
  void all_reduced() { x_.wait_for_ranks(2 * t_ + 2, c_, interrupt_); }

 private:
  SlotHeader* header(int r) const { return reinterpret_cast<SlotHeader*>(layout_buffer_ + r * slot_stride_); }

  ShmExchange& x_;
  const Collective& c_;
  const Interrupt& interrupt_;
  const uint32_t t_;
  const int b_;
  char* layout_buffer_ = nullptr;
  int64_t slot_stride_ = 0;
  char* result_ = nullptr;
};

void ShmExchange::begin(const Collective& c) {
  std::atomic_ref<uint64_t>(control(rank_)->seq).store(c.seq, std::memory_order_relaxed);
  deadline_ = std::chrono::steady_clock::now() + timeout_;
}

void ShmExchange::run(const Collective& c, const Interrupt& interrupt) {
  begin(c);
  switch (c.kind) {
    case CollectiveKind::AllReduce: return all_reduce(c, interrupt);
    case CollectiveKind::ReduceScatter: return reduce_scatter(c, interrupt);
    case CollectiveKind::AllGather: return all_gather(c, interrupt);
    case CollectiveKind::Broadcast: return broadcast(c, interrupt);
    case CollectiveKind::Barrier: return check(c, interrupt);
  }
}

void ShmExchange::check(const Collective& c, const Interrupt& interrupt) {
  if (c.kind != CollectiveKind::Barrier) begin(c);
  Chunk chunk(*this, c, interrupt);
  chunk.written();
  chunk.reduced();
}

namespace {

// Elements of `element` bytes per chunk when a slot holds `parts` parts of them, a multiple of 64
// bytes' worth so that every part starts on a cache line.
int64_t chunk_elements(int64_t element, int64_t parts) {
  const int64_t per_line = kLine / element;
  return std::max<int64_t>(per_line, kSlotBytes / element / parts / per_line * per_line);
}

// memcpy, for any size: a zero-element tensor may have no memory at all.
void copy(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

int64_t chunks_of(int64_t n, int64_t per_chunk) { return std::max<int64_t>(1, (n + per_chunk - 1) / per_chunk); }

// An all-reduce's parts of `m` elements over `size` ranks: rank p reduces [p * part, (p + 1) * part)
// (clipped to m), on cache lines of `line` elements.
int64_t part_of(int64_t m, int size, int64_t line) { return (m + size * line - 1) / (size * line) * line; }

// The inputs of a reduction in rank order, rank r's at `at(r)`: returns rank 0's and puts the
// others' in `rest` (See Note [Collectives through shared memory]: the order every element is
// reduced in).
template <typename At>
const void* in_rank_order(int size, std::vector<const void*>& rest, At&& at) {
  rest.clear();
  for (int r = 1; r < size; ++r) rest.push_back(at(r));
  return at(0);
}

}  // namespace

void ShmExchange::all_reduce(const Collective& c, const Interrupt& interrupt) {
  const int64_t e = c.input.element_size(), n = c.input.numel();
  const int64_t per_chunk = chunk_elements(e, 1), line = kLine / e;
  char* data = static_cast<char*>(c.input.data_ptr());
  const auto place = buffers_->find(data, n * e);
  std::vector<const void*> peers;
  peers.reserve(static_cast<size_t>(size_ - 1));
  for (int64_t k = 0, chunks = chunks_of(n, per_chunk); k < chunks; ++k) {
    const int64_t off = k * per_chunk, m = std::min(per_chunk, n - off);
    // Rank p's part of the chunk: elements [lo(p), lo(p + 1)), on cache lines.
    const int64_t part = part_of(m, size_, line);
    auto lo = [&](int p) { return std::min(m, p * part); };
    const int64_t mine = lo(rank_), mine_end = lo(rank_ + 1);
    char* src = data + off * e;
    Chunk chunk(*this, c, interrupt);
    copy(chunk.slot(rank_), src, static_cast<size_t>(mine * e));  // the parts the others reduce
    copy(chunk.slot(rank_) + mine_end * e, src + mine_end * e, static_cast<size_t>((m - mine_end) * e));
    if (k == 0 && place) chunk.offer(*place);
    chunk.written();
    if (k == 0 && chunk.offered_everywhere()) return all_reduce_in_place(c, *place, chunk);
    const void* first = in_rank_order(
        size_, peers, [&](int r) -> const void* { return r == rank_ ? src + mine * e : chunk.slot(r) + mine * e; });
    host_reduce(chunk.result() + mine * e, first, peers.data(), size_ - 1, mine_end - mine, c.input.scalar_type(), c.op,
                size_);
    chunk.reduced();
    chunk.all_reduced();
    copy(src, chunk.result(), static_cast<size_t>(m * e));
  }
}

void ShmExchange::all_reduce_in_place(const Collective& c, const ShmBuffers::Place& place, Chunk& chunk) {
  // Rank p reduces part p of every rank's tensor, a block at a time (the block stays in cache for
  // the copies into the others'), and every part is reduced once, by one rank: all get the same bits.
  const int64_t e = c.input.element_size(), n = c.input.numel(), line = kLine / e;
  const int64_t part = part_of(n, size_, line), block = kBlockBytes / e;
  const int64_t mine = std::min(n, rank_ * part), mine_end = std::min(n, (rank_ + 1) * part);
  char* own = place.at(rank_);
  std::vector<const void*> peers;
  for (int64_t lo = mine; lo < mine_end; lo += block) {
    const int64_t m = std::min(block, mine_end - lo);
    const void* first = in_rank_order(size_, peers, [&](int r) -> const void* { return place.at(r) + lo * e; });
    host_reduce(own + lo * e, first, peers.data(), size_ - 1, m, c.input.scalar_type(), c.op, size_);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) copy(place.at(r) + lo * e, own + lo * e, static_cast<size_t>(m * e));
    }
  }
  chunk.reduced();
  chunk.all_reduced();  // every part is in every rank's tensor
}

void ShmExchange::reduce_scatter(const Collective& c, const Interrupt& interrupt) {
  const int64_t e = c.output.element_size(), n = c.output.numel();
  const int64_t per_chunk = chunk_elements(e, size_);  // of each shard: the slot holds one per rank
  const char* in = static_cast<const char*>(c.input.data_ptr());
  char* out = static_cast<char*>(c.output.data_ptr());
  std::vector<const void*> peers;
  peers.reserve(static_cast<size_t>(size_ - 1));
  for (int64_t k = 0, chunks = chunks_of(n, per_chunk); k < chunks; ++k) {
    const int64_t off = k * per_chunk, m = std::min(per_chunk, n - off);
    Chunk chunk(*this, c, interrupt);
    for (int r = 0; r < size_; ++r) {  // rank r's shard of ours, for rank r to reduce
      if (r != rank_) copy(chunk.slot(rank_) + r * per_chunk * e, in + (r * n + off) * e, static_cast<size_t>(m * e));
    }
    chunk.written();
    const void* first = in_rank_order(size_, peers, [&](int r) -> const void* {
      return r == rank_ ? in + (rank_ * n + off) * e : chunk.slot(r) + rank_ * per_chunk * e;
    });
    host_reduce(out + off * e, first, peers.data(), size_ - 1, m, c.output.scalar_type(), c.op, size_);
    chunk.reduced();
  }
}

void ShmExchange::all_gather(const Collective& c, const Interrupt& interrupt) {
  const int64_t e = c.input.element_size(), n = c.input.numel();
  const int64_t per_chunk = chunk_elements(e, 1);
  const char* in = static_cast<const char*>(c.input.data_ptr());
  char* out = static_cast<char*>(c.output.data_ptr());
  const bool in_place = in == out + rank_ * n * e;
  for (int64_t k = 0, chunks = chunks_of(n, per_chunk); k < chunks; ++k) {
    const int64_t off = k * per_chunk, m = std::min(per_chunk, n - off);
    Chunk chunk(*this, c, interrupt);
    copy(chunk.slot(rank_), in + off * e, static_cast<size_t>(m * e));
    chunk.written();
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) copy(out + (r * n + off) * e, chunk.slot(r), static_cast<size_t>(m * e));
    }
    if (!in_place) copy(out + (rank_ * n + off) * e, in + off * e, static_cast<size_t>(m * e));
    chunk.reduced();
  }
}

void ShmExchange::broadcast(const Collective& c, const Interrupt& interrupt) {
  const int64_t e = c.input.element_size(), n = c.input.numel();
  const int64_t per_chunk = chunk_elements(e, 1);
  char* data = static_cast<char*>(c.input.data_ptr());
  for (int64_t k = 0, chunks = chunks_of(n, per_chunk); k < chunks; ++k) {
    const int64_t off = k * per_chunk, m = std::min(per_chunk, n - off);
    Chunk chunk(*this, c, interrupt);
    if (rank_ == c.root) copy(chunk.slot(rank_), data + off * e, static_cast<size_t>(m * e));
    chunk.written();
    if (rank_ != c.root) copy(data + off * e, chunk.slot(c.root), static_cast<size_t>(m * e));
    chunk.reduced();
  }
}

void ShmExchange::arrive(uint32_t value) {
  auto* me = control(rank_);
  std::atomic_ref<uint32_t>(me->counter).store(value, std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(me->sleepers).load(std::memory_order_seq_cst) != 0) {
    futex(&me->counter, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

bool ShmExchange::alive(int r) const {
  struct flock lock{};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = r;
  lock.l_len = 1;
  if (fcntl(fd_, F_OFD_GETLK, &lock) != 0) return true;  // cannot tell: the timeout decides
  return lock.l_type != F_UNLCK;
}

void ShmExchange::wait_for_ranks(uint32_t target, const Collective& c, const Interrupt& interrupt) {
  using Clock = std::chrono::steady_clock;
  auto next_check = Clock::now() + kSlice;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto* peer = control(r);
    std::atomic_ref<uint32_t> counter(peer->counter), sleepers(peer->sleepers);
    for (int spin = 0; spin < kSpins && !reached(counter.load(std::memory_order_acquire), target); ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    while (!reached(counter.load(std::memory_order_acquire), target)) {
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = counter.load(std::memory_order_seq_cst);
      if (!reached(seen, target)) {
        timespec slice{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kSlice).count()};
        futex(&peer->counter, FUTEX_WAIT, seen, &slice);
      }
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (reached(counter.load(std::memory_order_acquire), target) || Clock::now() < next_check) continue;
      next_check = Clock::now() + kSlice;
      if (std::string why = interrupt ? interrupt() : std::string(); !why.empty()) throw CommError(why);
      const uint64_t last = std::atomic_ref<uint64_t>(peer->seq).load(std::memory_order_relaxed);
      // Gone, unless it arrived (and then exited, e.g. after the last barrier) since the counter was read.
      if (!alive(r) && !reached(counter.load(std::memory_order_acquire), target)) {
        throw std::runtime_error(detail::cat("rank ", job_rank(r), " exited while ", c.what,
                                             " waited for it in shared memory (its process let go of the segment; "
                                             "the last collective it began: #",
                                             last, ")"));
      }
      if (Clock::now() < deadline_) continue;
      std::string late;  // every rank not there yet, not only the first
      for (int q = 0; q < size_; ++q) {
        auto* other = control(q);
        if (q == rank_ || reached(std::atomic_ref<uint32_t>(other->counter).load(), target)) continue;
        late += detail::cat(late.empty() ? "" : ", ", "rank ", job_rank(q), " (last began #",
                            std::atomic_ref<uint64_t>(other->seq).load(std::memory_order_relaxed), ")");
      }
      throw std::runtime_error(detail::cat("timed out waiting in shared memory for ", late));
    }
  }
}

}  // namespace dtcore
