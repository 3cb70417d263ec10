#include "dtcore/comm/gloo_communicator.h"

#include <mutex>

#include <c10/util/Exception.h>

#include "dtcore/common/c10_error.h"
#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"

namespace dtcore {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return c10d::ReduceOp::SUM;  // Avg: divided on completion
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// Names dead or stalled peers once a collective has failed (see HealthMonitor).
using FailureDiagnosis = std::function<std::string()>;

class GlooWork final : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::string what, int rank, int size, at::Tensor divide,
           FailureDiagnosis diagnosis, std::chrono::milliseconds default_timeout)
      : Work(default_timeout),
        work_(std::move(work)),
        what_(std::move(what)),
        rank_(rank),
        size_(size),
        divide_(std::move(divide)),
        diagnosis_(std::move(diagnosis)),
        start_(std::chrono::steady_clock::now()) {}

  using Work::wait;
  void wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(mu_);  // the division must happen exactly once
    if (done_) return;
    try {
      work_->wait(timeout);
    } catch (const std::exception& e) {
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      std::string msg = error_text(e);
      bool timed_out = msg.find("timed out") != std::string::npos || msg.find("Timed out") != std::string::npos;
      std::string who = diagnosis_ ? diagnosis_() : std::string();
      DTCORE_CHECK(false, CommError, what_, " ", timed_out ? "timed out" : "failed", " on rank ", rank_, " after ",
                   static_cast<int>(waited * 10) / 10.0, " s (timeout ", timeout.count() / 1000.0, " s): ", msg,
                   who.empty() ? std::string() : "\n" + who,
                   "\nFix: a peer rank has probably exited or stalled; look at the first error of the lowest failing "
                   "rank. If the work is just slow, raise init(timeout=) or ",
                   knobs::kTimeout.name, ".");
    }
    if (divide_.defined()) divide_.div_(size_);
    done_ = true;
  }

  // Finished either way (wait() raises a failure). For Avg, the division is done here once the
  // sum is in, so that polling alone yields the final result. Never blocks: if another thread is
  // inside wait(), that thread finishes the result and this one reports "not yet".
  bool is_completed() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (done_) return true;
    if (!work_->isCompleted()) return false;
    if (!work_->isSuccess()) return true;
    if (divide_.defined()) divide_.div_(size_);
    done_ = true;
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  int rank_;
  int size_;
  at::Tensor divide_;  // Avg: the result to divide by the world size once complete
  FailureDiagnosis diagnosis_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  bool done_ = false;
};

}  // namespace

GlooCommunicator::GlooCommunicator(c10::intrusive_ptr<c10d::Backend> backend, std::chrono::milliseconds timeout)
    : Communicator(backend->getRank(), backend->getSize(), timeout), backend_(std::move(backend)) {}

std::shared_ptr<Work> GlooCommunicator::start(const Collective& c) {
  std::lock_guard<std::mutex> lock(mu_);
  DTCORE_CHECK(backend_, CommError, c.what, " cannot start on rank ", rank(),
               ": the communicator is closed (dtcore.shutdown() was called). Fix: call dtcore.init() again.");
  // Gloo has no average: Avg is a sum divided by the world size once it is in (nothing to divide
  // with one rank).
  const bool average = c.op == ReduceOp::Avg && size() > 1;
  at::Tensor divide;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    switch (c.kind) {
      case CollectiveKind::AllReduce: {
        std::vector<at::Tensor> tensors{c.input};
        c10d::AllreduceOptions opts;
        opts.reduceOp = to_c10d(c.op);
        opts.timeout = timeout();
        work = backend_->allreduce(tensors, opts);
        if (average) divide = c.input;
        break;
      }
      case CollectiveKind::ReduceScatter: {
        at::Tensor out = c.output, in = c.input;
        c10d::ReduceScatterOptions opts;
        opts.reduceOp = to_c10d(c.op);
        opts.timeout = timeout();
        work = backend_->_reduce_scatter_base(out, in, opts);
        if (average) divide = c.output;
        break;
      }
      case CollectiveKind::AllGather: {
        at::Tensor out = c.output, in = c.input;
        c10d::AllgatherOptions opts;
        opts.timeout = timeout();
        work = backend_->_allgather_base(out, in, opts);
        break;
      }
      case CollectiveKind::Broadcast: {
        std::vector<at::Tensor> tensors{c.input};
        c10d::BroadcastOptions opts;
        opts.rootRank = c.root;
        opts.timeout = timeout();
        work = backend_->broadcast(tensors, opts);
        break;
      }
      case CollectiveKind::Barrier: {
        c10d::BarrierOptions opts;
        opts.timeout = timeout();
        work = backend_->barrier(opts);
        break;
      }
    }
  } catch (const std::exception& e) {
    DTCORE_CHECK(
        false, CommError, c.what, " could not start on rank ", rank(), ": ", error_text(e),
        ". Fix: if a peer exited, look at its error first; a closed or broken group needs dtcore.init() again.");
  }
  return std::make_shared<GlooWork>(std::move(work), c.what, rank(), size(), std::move(divide), diagnosis_for(c),
                                    timeout());
}

void GlooCommunicator::close() {
  std::lock_guard<std::mutex> lock(mu_);
  backend_.reset();  // the last reference: Gloo's threads and connections go with it
}

}  // namespace dtcore
