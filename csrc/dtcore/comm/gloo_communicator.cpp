#include "dtcore/comm/gloo_communicator.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include "dtcore/common/c10_error.h"
#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/log.h"

namespace dtcore {
namespace {

using Clock = std::chrono::steady_clock;

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return c10d::ReduceOp::SUM;  // Avg: divided on completion
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// How often a wait looks at the heartbeat's finding while Gloo works.
constexpr auto kDivergencePoll = std::chrono::milliseconds(100);

double seconds_since(Clock::time_point t) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count() / 100) /
         10.0;
}

// A view of `t`'s memory that does not own it. See Note [Borrowed buffers on Gloo].
at::Tensor borrowed(const at::Tensor& t) { return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options()); }

}  // namespace

// Note [Reduce-scatter on Gloo]
// torch's Gloo backend runs a reduce-scatter (_reduce_scatter_base, reduce_scatter) as an allreduce
// of the whole input: every rank sends 2 (N-1)/N of the input's bytes where a reduce-scatter needs
// (N-1)/N, so ZeRO-2 would send 1.5x what DDP's allreduce does per step. dtcore runs it as an
// all-to-all instead (each rank sends rank j the j-th shard of its input: (N-1)/N of the input,
// pairwise), and reduces the shards it received into the output when the work completes, in the
// thread that waits. In general the all-to-all receives into a buffer of N shards (the input's
// size; one sum over a (N, shard) view then reduces them, rounding a half-precision sum once).
// At 2 ranks it sends only the peer's shard and receives the peer's shard of ours straight into
// the output (split sizes 0 for itself), and the own shard is added to it there: no receive
// buffer at all, for ZeRO-2 a bucket less at the peak (unless the output shares memory with the
// input, which takes the general way). The output then holds the peer's shard until the work
// completes, and is undefined after a failure, as any failed collective's output. Measured on
// loopback at 8M floats (benchmarks/bench_collectives.py): 2 ranks 17.7 ms against Gloo's 57.9
// (torch's all-to-all and a sum: 41.0); 4 ranks 67.2 against 109.5.

// Note [Borrowed buffers on Gloo]
// Gloo's work object keeps the tensors it was given until its worker thread lets go of it, which
// may be after the collective has ended and the caller has dropped its own references: the
// buffers are then freed late, on Gloo's thread (ZeRO-2 holds a finished bucket beside the next
// one, and torch's profiler, which sees the frees of the rank's own threads only, counts it as
// never freed). A reduce-scatter's buffers (its input, the all-to-all's receive buffer and, at 2
// ranks, its output) are handed to Gloo as borrowed views, which own nothing: the GlooWork owns
// them and frees them with the caller's last reference (the receive buffer once reduced). Through
// shared memory the submitter lets go of the GlooWork before it reports the end. A GlooWork
// dropped before Gloo finished (an abandoned or failed wait) first waits for Gloo, with the
// timeout; if Gloo still has not finished, the buffers are leaked rather than freed under it.

// Note [In-place all-gather on Gloo]
// torch's Gloo backend runs _allgather_base into a fresh flat output the size of the whole
// result and then copies it into the caller's output: a transient copy of the whole buffer (for
// ZeRO's parameter gather, a whole bucket of parameters at every step). An all-gather whose input
// is this rank's own chunk of the output runs instead as N broadcasts in place, chunk r from rank
// r: no buffer at all, the same bytes on the wire as Gloo's ring (each rank sends its chunk to
// the N - 1 others), and Gloo's worker threads run the N broadcasts side by side. They are one
// Work (GlooWorkGroup): finished when all are, failed when any is.

// Several of Gloo's works as one, for a collective dtcore runs as many (see Note [In-place
// all-gather on Gloo]). It has no future: its end is reported by wait() or isCompleted().
class GlooWorkGroup final : public c10d::Work {
 public:
  explicit GlooWorkGroup(std::vector<c10::intrusive_ptr<c10d::Work>> parts) : parts_(std::move(parts)) {}

  bool isCompleted() override {
    for (auto& p : parts_) {
      if (!p->isCompleted()) return false;
    }
    return true;
  }
  bool isSuccess() const override {
    for (const auto& p : parts_) {
      if (!p->isSuccess()) return false;
    }
    return true;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (auto& p : parts_) {
      if (timeout.count() <= 0) {  // no limit: Gloo's own timeout
        p->wait(timeout);
        continue;
      }
      p->wait(std::max(std::chrono::milliseconds(1),
                       std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
    }
    return true;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
};

// A collective the submitter runs through shared memory, as Gloo's work: GlooWork waits on it as
// on Gloo's. Its failure is a std::runtime_error (a peer timed out or exited: GlooWork adds the
// diagnosis) or a CommError (a mismatch or an interruption: the whole message, as is). It has no
// future: the submitter reports the end through GlooWork::engine_done().
class SharedWork final : public c10d::Work {
 public:
  // Ended: `error` null for success; waits return.
  void end(std::exception_ptr error) { finish(std::move(error)); }
};

// One collective: queued until the submitter has checked it against the other ranks and handed
// it to Gloo (or failed it), then Gloo's work.
class GlooWork final : public Work, public std::enable_shared_from_this<GlooWork> {
 public:
  GlooWork(Collective c, int rank /* the job rank, for messages */, int size, std::function<std::string()> diagnosis,
           std::function<std::string()> divergence, std::chrono::milliseconds timeout)
      : Work(timeout, c.finished),
        c_(std::move(c)),
        rank_(rank),
        size_(size),
        diagnosis_(std::move(diagnosis)),
        divergence_(std::move(divergence)),
        timeout_(timeout),
        issued_(Clock::now()) {}
  GlooWork(const GlooWork&) = delete;
  GlooWork& operator=(const GlooWork&) = delete;

  // See Note [Borrowed buffers on Gloo]: Gloo may still use c_'s tensors and scatter_'s.
  // Its future's callback may hold the last reference: Gloo has finished then (gloo_done_).
  ~GlooWork() override {
    if (!work_ || work_->isCompleted() || gloo_done_) return;
    try {
      work_->wait(timeout_);
    } catch (const std::exception&) {
      // Failed is finished: Gloo no longer uses the buffers.
    }
    if (work_->isCompleted()) return;
    log::warn(c_.what, " was dropped on rank ", rank_, " while Gloo still runs it: its buffers are kept, not freed");
    new std::vector<at::Tensor>{c_.input, c_.output, scatter_.received};  // never freed, on purpose
  }

  const Collective& collective() const { return c_; }

  // The submitter handed it to Gloo; `scatter` is what a reduce-scatter reduces into the output
  // on completion (See Note [Reduce-scatter on Gloo]).
  void submitted(c10::intrusive_ptr<c10d::Work> work, GlooScatter scatter = {}) {
    // Some of Gloo's works (e.g. _reduce_scatter_base) have no future: their end is reported by
    // wait() or is_completed().
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (const std::exception&) {
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      work_ = work;
      scatter_ = std::move(scatter);
      has_future_ = future.defined();
    }
    cv_.notify_all();
    if (!future.defined()) return;
    // The flight recorder's end of it, whoever waits (or nobody), and the wake-up of a wait that
    // polls the heartbeat's finding. Never mu_: a wait holds it while Gloo completes the future.
    std::weak_ptr<GlooWork> self = weak_from_this();
    future->addCallback([self](c10::ivalue::Future& f) {
      if (auto w = self.lock()) {
        w->report_finished(!f.hasError());
        {
          std::lock_guard<std::mutex> lock(w->done_mu_);
          w->gloo_done_ = true;
        }
        w->done_cv_.notify_all();
      }
    });
  }

  // Failed, before the message is known: the flight recorder and the peers' diagnoses learn it
  // now, not after this rank's own diagnosis (a rank that then raises and exits is no suspect).
  void failing() { report_finished(false); }

  // The submitter runs it itself, through shared memory: an Avg is divided there, and the end is
  // reported by engine_done(), which a wait polls for as for a future's (heartbeat included).
  void running_shared(c10::intrusive_ptr<c10d::Work> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      work_ = std::move(work);
      averaged_ = true;
      has_future_ = true;
    }
    cv_.notify_all();
  }

  // The engine has finished with the buffers (shared memory: the submitter, before it lets go of
  // this work and reports the end): the flight recorder learns it, and a destructor that runs
  // before the end is reported has nothing to wait for.
  void engine_done(bool ok) {
    report_finished(ok);
    {
      std::lock_guard<std::mutex> lock(done_mu_);
      gloo_done_ = true;
    }
    done_cv_.notify_all();
  }

  // It will never reach Gloo: `why` is what every wait() raises.
  void failed(std::string why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = std::move(why);
    }
    cv_.notify_all();
    report_finished(false);
  }

  using Work::wait;
  void wait_for(std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mu_);
    if (done_) return;
    if (!cv_.wait_until(lock, deadline, [this] { return work_ || !failure_.empty(); })) {
      lock.unlock();           // the diagnosis takes seconds: the submitter must not wait on this work meanwhile
      report_finished(false);  // first: the peers' diagnoses then see this rank failed, not died
      std::string who = diagnosis_();
      DTCORE_CHECK(false, CommError, c_.what, " timed out", rank_text(), " after ", seconds_since(issued_),
                   " s (timeout ", timeout.count() / 1000.0,
                   " s) before it could start: the other ranks have not all issued it yet, so the check that they "
                   "call the same collective has not completed.",
                   who.empty() ? std::string() : "\n" + who,
                   "\nFix: look at the first error of the lowest failing rank. If the work is just slow, raise "
                   "init(timeout=) or ",
                   knobs::kTimeout.name, ".");
    }
    DTCORE_CHECK(failure_.empty(), CommError, failure_);
    // While Gloo works, the heartbeat may find that the ranks called different collectives: this
    // wait then fails at once instead of at the timeout. See Note [Collective signature].
    if (has_future_) {
      std::unique_lock<std::mutex> done(done_mu_);  // after mu_: the callback takes done_mu_ alone
      while (!gloo_done_ && Clock::now() < deadline) {
        done_cv_.wait_until(done, std::min(deadline, Clock::now() + kDivergencePoll), [this] { return gloo_done_; });
        if (gloo_done_) break;
        std::string diverged = divergence_();
        if (!diverged.empty()) {
          done.unlock();
          lock.unlock();
          fail_diverged(diverged);
        }
      }
    }
    c10::intrusive_ptr<c10d::Work> work = work_;
    const auto left = std::max(std::chrono::milliseconds(1),
                               std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    try {
      work->wait(left);
    } catch (const CommError&) {  // shared memory's final word: a mismatch or an interruption
      lock.unlock();
      report_finished(false);
      throw;
    } catch (const std::exception& e) {
      std::string msg = error_text(e);
      bool timed_out = msg.find("timed out") != std::string::npos || msg.find("Timed out") != std::string::npos;
      lock.unlock();
      report_finished(false);  // first: the peers' diagnoses then see this rank failed, not died
      std::string who = diagnosis_();
      // A peer that found the ranks' collectives differ raised and left: that is the cause.
      if (std::string diverged = divergence_(); !diverged.empty()) fail_diverged(diverged);
      DTCORE_CHECK(false, CommError, c_.what, " ", timed_out ? "timed out" : "failed", rank_text(), " after ",
                   seconds_since(issued_), " s (timeout ", timeout.count() / 1000.0, " s): ", msg,
                   who.empty() ? std::string() : "\n" + who,
                   "\nFix: a peer rank has probably exited or stalled; look at the first error of the lowest failing "
                   "rank. If the work is just slow, raise init(timeout=) or ",
                   knobs::kTimeout.name, ".");
    }
    complete_locked();
  }

  // Finished either way (wait() raises a failure). For Avg, the division is done here once the
  // sum is in, so that polling alone yields the final result. Never blocks: if another thread is
  // inside wait(), that thread finishes the result and this one reports "not yet".
  bool is_completed() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (done_ || !failure_.empty()) return true;
    if (!work_ || !work_->isCompleted()) return false;
    if (!work_->isSuccess()) return true;
    complete_locked();
    return true;
  }

 private:
  std::string rank_text() const { return detail::cat(" on rank ", rank_); }

  // The heartbeat found that the ranks called different collectives (See Note [Collective
  // signature]): this wait fails with that finding.
  void fail_diverged(const std::string& divergence) {
    report_finished(false);
    DTCORE_CHECK(false, CommError, c_.what, " failed", rank_text(), " after ", seconds_since(issued_),
                 " s: ", divergence);
  }

  // A reduce-scatter's shards are reduced, and for Avg the sum divided, exactly once.
  void complete_locked() {
    if (done_) return;
    if (scatter_.into_output || scatter_.received.defined()) {
      reduce_scatter_locked();
      scatter_ = GlooScatter();  // the buffers go now, not with the work
    }
    if (c_.op == ReduceOp::Avg && size_ > 1 && !averaged_) {
      (c_.kind == CollectiveKind::ReduceScatter ? c_.output : c_.input).div_(size_);
    }
    done_ = true;
    report_finished(true);
  }

  // The output becomes this rank's shard reduced with every peer's: See Note [Reduce-scatter on Gloo].
  void reduce_scatter_locked() {
    at::Tensor out = c_.output.view({c_.output.numel()});
    if (scatter_.into_output) {  // it holds the peer's shard: the own one joins it
      if (c_.op == ReduceOp::Max) {
        at::maximum_out(out, out, scatter_.own);
      } else if (c_.op == ReduceOp::Min) {
        at::minimum_out(out, out, scatter_.own);
      } else {
        out.add_(scatter_.own);
      }
      return;
    }
    if (c_.op == ReduceOp::Max) {  // one pass over the (N, shard) rows: a half sum is rounded once
      at::amax_out(out, scatter_.received, {0});
    } else if (c_.op == ReduceOp::Min) {
      at::amin_out(out, scatter_.received, {0});
    } else {
      at::sum_out(out, scatter_.received, {0});
    }
  }

  const Collective c_;  // holds the tensors until the collective is done
  const int rank_;
  const int size_;
  const std::function<std::string()> diagnosis_;
  const std::function<std::string()> divergence_;  // never blocks: Communicator::divergence_probe()
  const std::chrono::milliseconds timeout_;
  const Clock::time_point issued_;

  std::mutex mu_;  // the division must happen exactly once; guards the state below
  std::condition_variable cv_;
  c10::intrusive_ptr<c10d::Work> work_;  // set once handed to Gloo
  GlooScatter scatter_;                  // a reduce-scatter's shards, until reduced
  std::string failure_;                  // set when it never will be
  bool has_future_ = false;              // gloo_done_ will be set: by a future's callback or engine_done()
  bool averaged_ = false;                // the engine divided an Avg itself
  bool done_ = false;
  // Gloo finished it (ok or not): set by the future's callback, which must not take mu_ (a wait
  // holds mu_ while Gloo completes the future).
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool gloo_done_ = false;  // guarded by done_mu_
};

GlooCommunicator::GlooCommunicator(c10::intrusive_ptr<c10d::Backend> backend, const Options& options)
    : Communicator(backend->getRank(), backend->getSize(), options), backend_(std::move(backend)) {
  shm_ = ShmExchange::connect(backend_, options.shared_memory, timeout(), options.ranks);
  shared_memory_ = shm_ != nullptr;
  if (shm_) buffers_ = shm_->buffers();
  submitter_ = std::thread([this] { submit_loop(); });
}

at::Tensor GlooCommunicator::shared_buffer(int64_t bytes) {
  return buffers_ ? buffers_->allocate(*this, bytes) : at::Tensor();
}

GlooCommunicator::~GlooCommunicator() { close(); }

std::shared_ptr<Work> GlooCommunicator::start(const Collective& c) {
  auto work = std::make_shared<GlooWork>(c, job_rank(), size(), diagnosis_for(c), divergence_probe(), timeout());
  {
    std::lock_guard<std::mutex> lock(mu_);
    DTCORE_CHECK(backend_, CommError, c.what, " cannot start on rank ", job_rank(),
                 ": the communicator is closed (dtcore.shutdown() was called). Fix: call dtcore.init() again.");
    queue_.push_back(work);
  }
  cv_.notify_all();
  return work;
}

c10::intrusive_ptr<c10d::Backend> GlooCommunicator::engine() {
  std::lock_guard<std::mutex> lock(mu_);
  return backend_;
}

void GlooCommunicator::close() {
  std::deque<std::shared_ptr<GlooWork>> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    closing_ = true;
    orphans.swap(queue_);
  }
  cv_.notify_all();
  if (submitter_.joinable() && submitter_.get_id() != std::this_thread::get_id()) submitter_.join();
  for (auto& w : orphans) {
    w->failed(detail::cat(w->collective().what, " did not start on rank ", job_rank(),
                          ": the communicator was closed (dtcore.shutdown()) first. Fix: wait on every collective "
                          "before dtcore.shutdown()."));
  }
  std::lock_guard<std::mutex> lock(mu_);
  backend_.reset();  // the last reference: Gloo's threads and connections go with it
  shm_.reset();      // the submitter has stopped: nothing uses it
}

void GlooCommunicator::submit_loop() {
  for (;;) {
    std::shared_ptr<GlooWork> work;
    c10::intrusive_ptr<c10d::Backend> backend;
    std::string failure;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      work = std::move(queue_.front());
      queue_.pop_front();
      backend = backend_;
      failure = failure_;
    }
    const Collective& c = work->collective();
    if (!failure.empty()) {
      work->failed(
          detail::cat(c.what, " was not started on rank ", job_rank(), ": an earlier collective failed. ", failure));
      continue;
    }
    if (shm_ && ShmExchange::supports(c)) {
      run_shared(std::move(work));
      continue;
    }
    std::string mismatch;
    try {
      // Through shared memory the check costs nothing, so it is always made.
      mismatch = check() == CollectiveCheck::kNever && !shm_ ? "" : check_against_peers(backend, c);
    } catch (const CommError& e) {  // the check through shared memory was interrupted: the final word
      work->failing();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failure_.empty()) failure_ = e.what();
      }
      work->failed(e.what());
      continue;
    } catch (const std::exception& e) {
      work->failing();
      // The check itself failed (a peer died or never issued the collective): Gloo's group is
      // broken, so nothing later can run either.
      std::string who = diagnosis_for(c)();
      std::string why = detail::cat(c.what, " failed on rank ", job_rank(),
                                    " while checking it against the other ranks: ", error_text(e),
                                    who.empty() ? std::string() : "\n" + who,
                                    "\nFix: a peer rank has probably exited or stalled; look at the first error of the "
                                    "lowest failing rank.");
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failure_.empty()) failure_ = why;
      }
      work->failed(why);
      continue;
    }
    if (!mismatch.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = mismatch;
      }
      log::error(mismatch);
      work->failed(mismatch);
      continue;
    }
    try {
      GlooScatter scatter;
      auto handed = launch(backend, c, scatter);
      work->submitted(std::move(handed), std::move(scatter));
    } catch (const std::exception& e) {
      // Gloo refused it before it ran (input is checked first, so this is rare). The peers may have
      // started theirs: the group is out of step, so nothing later may run either.
      std::string why = detail::cat(c.what, " could not start on rank ", job_rank(), ": ", error_text(e));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failure_.empty()) failure_ = why;
      }
      work->failed(why);
    }
  }
}

ShmExchange::Interrupt GlooCommunicator::interrupt_for(const Collective& c) {
  return [this, what = c.what, began = Clock::now(), divergence = divergence_probe()]() -> std::string {
    if (closing_) {
      return detail::cat(what, " was interrupted on rank ", job_rank(),
                         ": the communicator was closed (dtcore.shutdown()) while it ran. Fix: wait on every "
                         "collective before dtcore.shutdown().");
    }
    std::string diverged = divergence();
    if (diverged.empty()) return diverged;
    return detail::cat(what, " failed on rank ", job_rank(), " after ", seconds_since(began), " s: ", diverged);
  };
}

void GlooCommunicator::run_shared(std::shared_ptr<GlooWork> work) {
  auto shared = c10::make_intrusive<SharedWork>();
  work->running_shared(shared);  // waits see it running, and poll the heartbeat's finding
  std::exception_ptr error;
  std::string failure;  // what every later collective fails with
  {
    const Collective& c = work->collective();
    try {
      shm_->run(c, interrupt_for(c));
    } catch (const ShmMismatch&) {
      work->failing();  // first: the peers' diagnoses then see this rank failed, not stalled
      failure = mismatch_message(c);
      log::error(failure);
      error = std::make_exception_ptr(CommError(failure));
    } catch (const CommError& e) {
      work->failing();
      failure = e.what();
      error = std::current_exception();
    } catch (const std::exception& e) {
      work->failing();
      failure = detail::cat(c.what, " failed on rank ", job_rank(), " in shared memory: ", error_text(e));
      error = std::current_exception();
    }
  }
  if (error) {
    std::lock_guard<std::mutex> lock(mu_);  // the segment's state is unknown: nothing more runs
    if (failure_.empty()) failure_ = failure;
  }
  // Let go before the end is known, so that the caller's last reference frees the collective's
  // tensors, on the caller's thread (See Note [Borrowed buffers on Gloo]).
  work->engine_done(!error);
  work.reset();
  shared->end(error);
}

std::string GlooCommunicator::check_against_peers(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                  const Collective& c) {
  if (size() == 1) return "";
  if (shm_) {  // one step through the segment that compares the signatures
    try {
      shm_->check(c, interrupt_for(c));
      return "";
    } catch (const ShmMismatch&) {
      return mismatch_message(c);
    }
  }
  if (same_on_every_rank(backend, c.signature, timeout())) return "";
  return mismatch_message(c);
}

c10::intrusive_ptr<c10d::Work> GlooCommunicator::launch(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                        const Collective& c, GlooScatter& scatter) {
  switch (c.kind) {
    case CollectiveKind::AllReduce: {
      std::vector<at::Tensor> tensors{c.input};
      c10d::AllreduceOptions opts;
      opts.reduceOp = to_c10d(c.op);
      opts.timeout = timeout();
      return backend->allreduce(tensors, opts);
    }
    case CollectiveKind::ReduceScatter: {  // See Note [Reduce-scatter on Gloo]
      const int64_t n = c.output.numel();
      at::Tensor in = c.input.view({c.input.numel()});  // (N * shard,)
      c10d::AllToAllOptions opts;
      opts.timeout = timeout();
      if (size() == 2 && !c.output.is_alias_of(c.input)) {  // the peer's shard straight into the output
        const int peer = 1 - rank();
        scatter.own = in.narrow(0, rank() * n, n);
        scatter.into_output = true;
        // Elements to and from each rank: the peer's shard only. Two vectors: Gloo moves from both.
        std::vector<int64_t> to(2, 0), from(2, 0);
        to[peer] = from[peer] = n;
        // Borrowed: the GlooWork owns these buffers (See Note [Borrowed buffers on Gloo]).
        at::Tensor out = borrowed(c.output.view({n})), sent = borrowed(in.narrow(0, peer * n, n));
        return backend->alltoall_base(out, sent, from, to, opts);
      }
      scatter.received = at::empty({size(), n}, in.options());  // (N, shard): rank j's shard of ours
      std::vector<int64_t> even;                                // empty split sizes: N equal shards
      at::Tensor out = borrowed(scatter.received), sent = borrowed(in);
      return backend->alltoall_base(out, sent, even, even, opts);
    }
    case CollectiveKind::AllGather: {
      at::Tensor out = c.output, in = c.input;
      if (in.is_alias_of(out)) {  // in place: See Note [In-place all-gather on Gloo]
        const int64_t n = in.numel();
        at::Tensor flat = out.view({out.numel()});
        std::vector<c10::intrusive_ptr<c10d::Work>> parts;
        for (int r = 0; r < size(); ++r) {
          std::vector<at::Tensor> chunk{flat.narrow(0, r * n, n)};
          c10d::BroadcastOptions opts;
          opts.rootRank = r;
          opts.timeout = timeout();
          parts.push_back(backend->broadcast(chunk, opts));
        }
        return c10::make_intrusive<GlooWorkGroup>(std::move(parts));
      }
      c10d::AllgatherOptions opts;
      opts.timeout = timeout();
      return backend->_allgather_base(out, in, opts);
    }
    case CollectiveKind::Broadcast: {
      std::vector<at::Tensor> tensors{c.input};
      c10d::BroadcastOptions opts;
      opts.rootRank = c.root;
      opts.timeout = timeout();
      return backend->broadcast(tensors, opts);
    }
    case CollectiveKind::Barrier: {
      c10d::BarrierOptions opts;
      opts.timeout = timeout();
      return backend->barrier(opts);
    }
  }
  DTCORE_CHECK(false, CommError, "dtcore bug: collective kind ", static_cast<int>(c.kind), " unknown");
  return {};
}

}  // namespace dtcore
