#include "dtcore/reducer/comm_hook.h"

#include <condition_variable>
#include <memory>
#include <mutex>

#include "dtcore/common/error.h"

namespace dtcore {

HookFuture hook_bucket(CommHook& hook, const std::vector<Bucket>& plan, size_t index, const at::Tensor& buffer,
                       const std::vector<at::Tensor>& params, const std::string& label) {
  const Bucket& bucket = plan[index];
  std::vector<size_t> offsets, lengths;
  std::vector<c10::IntArrayRef> sizes;  // views of the parameters' sizes, which outlive the call
  std::vector<at::Tensor> bucket_params;
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    const at::Tensor& p = params[bucket.params[k]];
    offsets.push_back(static_cast<size_t>(bucket.offsets[k]));
    lengths.push_back(static_cast<size_t>(bucket.numels[k]));
    sizes.push_back(p.sizes());
    bucket_params.push_back(p);
  }
  c10d::GradBucket grad_bucket(index, plan.size(), buffer, std::move(offsets), std::move(lengths), std::move(sizes),
                               std::move(bucket_params), std::nullopt);
  HookFuture future = hook.runHook(grad_bucket);
  DTCORE_CHECK(future, ConfigError, "the communication hook returned no future for ", label,
               ". Fix: return a torch.futures.Future holding the reduced bucket (a completed one if the hook "
               "communicates nothing).");
  return future;
}

void wait_hook_future(const HookFuture& future, std::chrono::milliseconds timeout, const std::string& what, int rank) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();  // shared: the callback may run after a timed-out wait returned
  future->addCallback([done](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(done->mu);
    const bool completed = done->cv.wait_for(lock, timeout, [&] { return done->done; });
    DTCORE_CHECK(completed, CommError, what, " did not complete on rank ", rank, " within the timeout (",
                 timeout.count() / 1000.0,
                 " s): the future the communication hook returned was never completed. Fix: return a future "
                 "that completes (a collective's work.get_future(), or one whose set_result() is called); if the "
                 "hook's collectives are just slow, raise init(timeout=).");
  }
  DTCORE_CHECK(!future->hasError(), CommError, what, " failed on rank ", rank, ": ", future->tryRetrieveErrorMessage(),
               "\nFix: see the error above; it was raised by the communication hook or the work its future waits on.");
  future->wait();  // completed: returns at once, and on GPU makes the result usable on the current stream
}

at::Tensor hook_result(CommHook& hook, const HookFuture& future, int64_t numel, const std::string& label) {
  at::Tensor result = hook.parseHookResult(future->value());
  DTCORE_CHECK(result.defined() && result.numel() == numel, ConfigError, "the communication hook's future for ", label,
               " holds ", result.defined() ? std::to_string(result.numel()) : std::string("no"),
               " elements, but the bucket has ", numel,
               ". Fix: complete the future with one tensor shaped like bucket.buffer() (the reduced bucket).");
  return result;
}

}  // namespace dtcore
