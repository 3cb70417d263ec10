#include "dtcore/comm/gloo_communicator.h"

#include <mutex>

#include <c10/util/Exception.h>

#include "dtcore/common/c10_error.h"
#include "dtcore/common/error.h"

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
           FailureDiagnosis diagnosis)
      : work_(std::move(work)),
        what_(std::move(what)),
        rank_(rank),
        size_(size),
        divide_(std::move(divide)),
        diagnosis_(std::move(diagnosis)),
        start_(std::chrono::steady_clock::now()) {}

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
                   "rank. If the work is just slow, raise init(timeout=) or DTCORE_TIMEOUT.");
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

std::shared_ptr<Work> GlooCommunicator::launch(std::string_view op_name, uint64_t seq, const at::Tensor& described,
                                               const ReduceOp* op,
                                               const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
                                               at::Tensor divide_on_completion) {
  std::string what = describe(op_name, seq, described, op);
  c10::intrusive_ptr<c10d::Work> work;
  std::lock_guard<std::mutex> lock(mu_);
  DTCORE_CHECK(backend_, CommError, what, " cannot start on rank ", rank(),
               ": the communicator is closed (dtcore.shutdown() was called). Fix: call dtcore.init() again.");
  try {
    work = start();
  } catch (const std::exception& e) {
    DTCORE_CHECK(false, CommError, what, " could not start on rank ", rank(), ": ", error_text(e),
                 ". Fix: if a peer exited, look at its error first; a closed or broken group needs dtcore.init() again.");
  }
  return std::make_shared<GlooWork>(std::move(work), std::move(what), rank(), size(), std::move(divide_on_completion),
                                    diagnosis_for(seq, op_name));
}

std::shared_ptr<Work> GlooCommunicator::allreduce(const at::Tensor& tensor, ReduceOp op) {
  check_input(tensor, "the tensor", "all_reduce", &op);
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = timeout();
  // Avg divides by the world size once the sum is in; with one rank there is nothing to divide.
  return launch("allreduce", next_seq(), tensor, &op, [&] { return backend_->allreduce(tensors, opts); },
                op == ReduceOp::Avg && size() > 1 ? tensor : at::Tensor());
}

std::shared_ptr<Work> GlooCommunicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_input(output, "the output", "reduce_scatter", &op);
  check_input(input, "the input", "reduce_scatter", &op);
  check_flat_sizes(input, output, "reduce_scatter");
  at::Tensor out = output, in = input;
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = timeout();
  return launch("reduce_scatter", next_seq(), input, &op,
                [&] { return backend_->_reduce_scatter_base(out, in, opts); },
                op == ReduceOp::Avg && size() > 1 ? output : at::Tensor());
}

std::shared_ptr<Work> GlooCommunicator::all_gather(const at::Tensor& output, const at::Tensor& input) {
  check_input(output, "the output", "all_gather");
  check_input(input, "the input", "all_gather");
  check_flat_sizes(output, input, "all_gather");
  at::Tensor out = output, in = input;
  c10d::AllgatherOptions opts;
  opts.timeout = timeout();
  return launch("all_gather", next_seq(), input, nullptr, [&] { return backend_->_allgather_base(out, in, opts); });
}

std::shared_ptr<Work> GlooCommunicator::broadcast(const at::Tensor& tensor, int root) {
  check_input(tensor, "the tensor", "broadcast");
  check_root(root);
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout();
  return launch("broadcast", next_seq(), tensor, nullptr, [&] { return backend_->broadcast(tensors, opts); });
}

void GlooCommunicator::close() {
  std::lock_guard<std::mutex> lock(mu_);
  backend_.reset();  // the last reference: Gloo's threads and connections go with it
}

std::shared_ptr<Work> GlooCommunicator::barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout();
  return launch("barrier", next_seq(), at::Tensor(), nullptr, [&] { return backend_->barrier(opts); });
}

}  // namespace dtcore
