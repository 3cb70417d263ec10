#include "dtcore/comm/communicator.h"

#include <chrono>

#include <ATen/ThreadLocalState.h>
#include <ATen/record_function.h>
#include <c10/core/ScalarType.h>

#include "dtcore/common/dtype.h"
#include "dtcore/common/env.h"
#include "dtcore/common/error.h"
#include "dtcore/common/units.h"

namespace dtcore {

namespace {
thread_local std::chrono::steady_clock::duration waited{};  // See wait_seconds()
}  // namespace

double wait_seconds() { return std::chrono::duration<double>(waited).count(); }

void Work::wait(std::chrono::milliseconds timeout) {
  struct Clocked {  // counted also when wait_for() throws
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    ~Clocked() { waited += std::chrono::steady_clock::now() - start; }
  } clocked;
  wait_for(timeout);
}

ReduceOp parse_reduce_op(std::string_view text) {
  const std::string name = ascii_lower(text);
  if (name == "sum") return ReduceOp::Sum;
  if (name == "avg" || name == "mean") return ReduceOp::Avg;
  if (name == "max") return ReduceOp::Max;
  if (name == "min") return ReduceOp::Min;
  DTCORE_CHECK(false, ConfigError, "op='", name,
               "' is not a reduction dtcore knows. Fix: use one of 'sum', 'avg', "
               "'max', 'min'.");
  return ReduceOp::Sum;  // unreachable
}

std::string_view reduce_op_name(ReduceOp op) {
  static constexpr std::string_view kNames[] = {"sum", "avg", "max", "min"};  // in ReduceOp's order
  return kNames[static_cast<int>(op)];
}

Communicator::Communicator(int rank, int size, const Options& options)
    : rank_(rank),
      size_(size),
      ranks_(options.ranks),
      timeout_(options.timeout),
      check_(options.check),
      recorder_(std::make_shared<FlightRecorder>(options.flight_records)) {
  DTCORE_CHECK(ranks_.empty() || ranks_.size() == static_cast<size_t>(size), ConfigError, "a communicator of ", size,
               " ranks was given ", ranks_.size(),
               " job ranks for its members. Fix: pass the group's rank list "
               "(torch.distributed.get_process_group_ranks(group)).");
}

std::vector<int> Communicator::job_ranks() const {
  std::vector<int> out;
  for (int r = 0; r < size_; ++r) out.push_back(job_rank(r));
  return out;
}

void Communicator::check_input(const at::Tensor& t, std::string_view what, std::string_view op_name,
                               const ReduceOp* op) const {
  DTCORE_CHECK(t.defined(), ConfigError, op_name, ": ", what,
               " is an undefined tensor. Fix: pass a tensor that holds data (e.g. torch.zeros(...)).");
  DTCORE_CHECK(accepts_device(t), ConfigError, op_name, ": ", what, " is on ", t.device().str(),
               ", but this job's backend is ", backend(), backend() == "gloo" ? " (CPU tensors)" : " (CUDA tensors)",
               ". Fix: move the tensor (", backend() == "gloo" ? ".cpu()" : ".cuda()",
               ") or initialize with the matching backend (dtcore.init(backend=...)).");
  // Sparse first: a sparse tensor is never contiguous, and "contiguous()" would not help.
  DTCORE_CHECK(!t.is_sparse(), ConfigError, op_name, ": ", what,
               " is sparse; dtcore reduces dense tensors only. Fix: pass tensor.to_dense().");
  DTCORE_CHECK(t.is_contiguous(), ConfigError, op_name, ": ", what,
               " is not contiguous. Fix: pass tensor.contiguous() (and copy the result back if needed).");
  check_engine_input(t, what, op_name);
  if (op != nullptr && *op == ReduceOp::Avg) {
    DTCORE_CHECK(at::isFloatingType(t.scalar_type()), ConfigError, op_name, ": op='avg' needs a floating-point ",
                 "tensor, but ", what, " is ", dtype_name(t.scalar_type()),
                 ". Fix: use op='sum' and divide by the world size yourself, choosing how to round.");
  }
}

void Communicator::check_flat_sizes(const at::Tensor& big, std::string_view big_name, const at::Tensor& small,
                                    std::string_view small_name, std::string_view op_name) const {
  DTCORE_CHECK(big.numel() == small.numel() * size_, ConfigError, op_name, ": the ", big_name, " has ", big.numel(),
               " elements but must have world size x ", small.numel(), " = ", small.numel() * size_,
               ". Fix: size it as world_size * shard elements.");
  DTCORE_CHECK(big.scalar_type() == small.scalar_type(), ConfigError, op_name, ": the ", big_name, " is ",
               dtype_name(big.scalar_type()), " but the ", small_name, " is ", dtype_name(small.scalar_type()),
               ". Fix: give both buffers the same dtype.");
}

CommunicatorOptions CommunicatorOptions::from(const Settings& settings) {
  CommunicatorOptions o;
  o.timeout = seconds_to_timeout(settings.timeout_s.value, settings.timeout_s.source);
  const std::string& check = settings.check_collectives.value;
  o.check = check == "1" ? CollectiveCheck::kAlways : check == "0" ? CollectiveCheck::kNever : CollectiveCheck::kAuto;
  o.flight_records = static_cast<size_t>(settings.flight_records.value);
  const std::string& shm = settings.shared_memory.value;
  o.shared_memory = shm == "1" ? SharedMemory::kRequired : shm == "0" ? SharedMemory::kOff : SharedMemory::kAuto;
  return o;
}

std::string_view collective_name(CollectiveKind kind) {
  static constexpr std::string_view kNames[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                "barrier"};  // in CollectiveKind's order
  return kNames[static_cast<int>(kind)];
}

namespace {

Collective collective(CollectiveKind kind, at::Tensor input, at::Tensor output, ReduceOp op, int root,
                      std::string_view label) {
  Collective c;
  c.kind = kind;
  c.input = std::move(input);
  c.output = std::move(output);
  c.op = op;
  c.root = root;
  c.label = label;
  return c;
}

}  // namespace

std::shared_ptr<Work> Communicator::all_reduce(const at::Tensor& tensor, ReduceOp op, std::string_view label) {
  check_input(tensor, "the tensor", "all_reduce", &op);
  return issue(collective(CollectiveKind::AllReduce, tensor, at::Tensor(), op, 0, label));
}

std::shared_ptr<Work> Communicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                                   std::string_view label) {
  check_input(output, "the output", "reduce_scatter", &op);
  check_input(input, "the input", "reduce_scatter", &op);
  check_flat_sizes(input, "input", output, "output", "reduce_scatter");
  return issue(collective(CollectiveKind::ReduceScatter, input, output, op, 0, label));
}

std::shared_ptr<Work> Communicator::all_gather(const at::Tensor& output, const at::Tensor& input,
                                               std::string_view label) {
  check_input(output, "the output", "all_gather");
  check_input(input, "the input", "all_gather");
  check_flat_sizes(output, "output", input, "input", "all_gather");
  if (input.is_alias_of(output)) {  // in place: only this rank's own chunk can be read and written alike
    const int64_t n = input.numel();
    const auto* own =
        static_cast<const char*>(output.data_ptr()) + rank_ * n * static_cast<int64_t>(output.element_size());
    DTCORE_CHECK(input.data_ptr() == own, ConfigError, "all_gather: the input shares memory with the output but is ",
                 "not rank ", rank_, "'s chunk of it (elements [", rank_ * n, ", ", (rank_ + 1) * n,
                 ")), so the gather would overwrite what it sends. Fix: pass output.narrow(0, rank * n, n) as the ",
                 "input (in place), or an input that does not overlap the output.");
  }
  return issue(collective(CollectiveKind::AllGather, input, output, ReduceOp::Sum, 0, label));
}

std::shared_ptr<Work> Communicator::broadcast(const at::Tensor& tensor, int root, std::string_view label) {
  check_input(tensor, "the tensor", "broadcast");
  DTCORE_CHECK(root >= 0 && root < size_, ConfigError, "broadcast: src=", root, " is not a rank of this ",
               ranks_.empty() ? "job" : "group", " (0..", size_ - 1,
               "). Fix: pass the rank that holds the data, e.g. src=0.");
  return issue(collective(CollectiveKind::Broadcast, tensor, at::Tensor(), ReduceOp::Sum, root, label));
}

std::shared_ptr<Work> Communicator::barrier(std::string_view label) {
  return issue(collective(CollectiveKind::Barrier, at::Tensor(), at::Tensor(), ReduceOp::Sum, 0, label));
}

namespace {

// A 64-bit mixing step (splitmix64's finalizer): every input bit affects every output bit.
uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

// See Note [Collective signature]: what must match, collective by collective.
uint64_t sign(uint64_t previous, const Collective& c) {
  uint64_t h = mix(previous, c.seq);
  h = mix(h, static_cast<uint64_t>(c.kind));
  if (c.kind == CollectiveKind::AllReduce || c.kind == CollectiveKind::ReduceScatter) {
    h = mix(h, static_cast<uint64_t>(c.op));
  }
  if (c.kind == CollectiveKind::Broadcast) h = mix(h, static_cast<uint64_t>(c.root));
  for (const at::Tensor* t : {&c.input, &c.output}) {
    if (!t->defined()) continue;
    h = mix(h, static_cast<uint64_t>(t->scalar_type()));
    h = mix(h, static_cast<uint64_t>(t->numel()));
  }
  return h;
}

// "torch.float32[4096], avg": what the call is beyond its kind; "" for a barrier.
std::string call_detail(const Collective& c) {
  std::string out;
  auto add = [&out](std::string_view part) {
    if (!out.empty()) out += ", ";
    out += part;
  };
  if (c.input.defined()) add(detail::cat(dtype_name(c.input.scalar_type()), "[", c.input.numel(), "]"));
  if (c.output.defined()) add(detail::cat("into ", c.output.numel()));
  if (c.kind == CollectiveKind::AllReduce || c.kind == CollectiveKind::ReduceScatter) add(reduce_op_name(c.op));
  if (c.kind == CollectiveKind::Broadcast) add(detail::cat("from rank ", c.root));
  return out;
}

// `name` and `detail` as messages show them: "all_reduce (torch.float32[4096], avg)".
std::string with_detail(std::string name, const std::string& detail) {
  return detail.empty() ? name : name + " (" + detail + ")";
}

}  // namespace

std::string describe(const Collective& c) { return with_detail(std::string(collective_name(c.kind)), call_detail(c)); }

std::string Communicator::mismatch_message(const Collective& c) const {
  const std::string mine = describe(c);
  std::string calls = health_ ? health_->gather_calls(c.seq, mine) : std::string();
  if (calls.empty())
    calls = detail::cat("\n  - rank ", job_rank(), ": ", mine, " (the others' calls could not be read)");
  return divergence_message(c.seq, false, calls, "No data was exchanged for it.");
}

std::function<std::string()> Communicator::divergence_probe() const {
  std::shared_ptr<HealthMonitor> health;
  {
    std::lock_guard<std::mutex> lock(issue_mu_);  // an engine's thread may ask while set_health() runs
    health = health_;
  }
  return [health = std::move(health)] { return health ? health->divergence() : std::string(); };
}

namespace {

// Note [Collectives in the profiler]
// As c10d's process groups do, every collective is an event of torch's profiler named
// "<backend>:<collective>" ("gloo:all_reduce", "nccl:broadcast"), with its tensors as inputs (for
// record_shapes), from its issue to its end. The end is reported by the engine on another thread
// (Gloo's submitter, NCCL's watchdog), so the event is async, and the end runs with the issuing
// thread's profiler state. When no profiler is on, nothing is recorded or allocated.
std::string_view profiling_title(std::string_view backend, CollectiveKind kind) {
  static constexpr std::string_view kGloo[] = {"gloo:all_reduce", "gloo:reduce_scatter", "gloo:all_gather",
                                               "gloo:broadcast", "gloo:barrier"};  // in CollectiveKind's order
  static constexpr std::string_view kNccl[] = {"nccl:all_reduce", "nccl:reduce_scatter", "nccl:all_gather",
                                               "nccl:broadcast", "nccl:barrier"};
  return (backend == "nccl" ? kNccl : kGloo)[static_cast<int>(kind)];
}

// The profiler's event for `c`, begun; null when no profiler records.
std::function<void()> profile(const Collective& c, std::string_view backend) {
  if (!at::hasCallbacks()) return {};  // no profiler (nor any other observer): nothing to allocate
  auto event = std::make_shared<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (!event->isActive()) return {};
  event->_setAsync();
  std::vector<c10::IValue> inputs;
  if (c.input.defined()) inputs.emplace_back(c.input);
  if (c.output.defined()) inputs.emplace_back(c.output);
  event->before(profiling_title(backend, c.kind), c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
  return at::wrapPropagateTLSState(std::function<void()>([event] { event->end(); }));
}

}  // namespace

std::shared_ptr<Work> Communicator::issue(Collective c) {
  // The ranks were found to differ (See Note [Collective signature]): nothing more runs.
  if (health_ && health_->diverged()) {
    if (!divergence_dumped_.exchange(true)) recorder_->dump("the ranks called different collectives");
    DTCORE_CHECK(false, CommError, describe(c), " was not started on rank ", rank_, ": an earlier collective failed. ",
                 health_->divergence());
  }
  {
    // Numbered and signed under one lock, so that the signature chain follows the numbers.
    std::lock_guard<std::mutex> lock(issue_mu_);
    c.seq = ++seq_;
    c.signature = signature_ = sign(signature_, c);
  }
  const std::string_view name = collective_name(c.kind);
  std::string detail = call_detail(c);
  c.what = with_detail(detail::cat(name, " #", c.seq), detail);  // "all_reduce #12 (torch.float32[4096], avg)"
  recorder_->issued(CollectiveRecord{c.seq, std::string(name), std::move(detail), c.label, c.signature});
  if (health_) health_->record_started(c.seq, c.what, c.signature);
  c.finished = [recorder = recorder_, health = health_, seq = c.seq, profiled = profile(c, backend())](bool ok) {
    recorder->finished(seq, ok);
    if (health) health->record_finished(seq, ok);
    if (profiled) profiled();  // See Note [Collectives in the profiler]
  };
  return start(c);
}

}  // namespace dtcore
