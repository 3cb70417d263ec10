// Communication hooks: torch DDP's interface for replacing the reducer's own reduction of a bucket.
//
// Note [Communication hooks]
// A hook is torch's c10d::CommHookInterface (a Python hook arrives as torch's c10d::PythonCommHook,
// so torch's own hooks, PowerSGD and the compression wrappers run unchanged). When one is
// registered, each bucket, as soon as it is ready and in plan order as the reducer's own
// collectives, is handed to the hook as a c10d::GradBucket over the bucket's flat buffer instead
// of being all-reduced; the hook returns a future of the reduced flat tensor. The gradients are
// not pre-divided: as in torch, the hook averages (torch's allreduce_hook divides by the world
// size itself). At the end of backward the reducer waits for every bucket's future, with the
// communicator's timeout (a future that never completes is a CommError naming the bucket, not a
// hang), and copies the result into the bucket buffer, that is into every .grad.
//
// Thread safety: hook_bucket() calls the hook on the calling thread (an autograd engine thread;
// a Python hook takes the GIL itself) while the reducer holds its lock, so a hook must not call
// back into the model's reducer (collectives of its own are fine); wait_hook_future() may be
// called from any thread.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include "dtcore/reducer/bucket_plan.h"

namespace dtcore {

using CommHook = c10d::CommHookInterface;
using HookFuture = c10::intrusive_ptr<c10::ivalue::Future>;

// Runs `hook` on bucket `index` of `plan` whose contents are `buffer` (the bucket's flat buffer, or
// zeros of its shape for a joined rank); `params` are the reducer's parameters, indexed as the
// plan's. ConfigError, naming the bucket, when the hook returns no future.
HookFuture hook_bucket(CommHook& hook, const std::vector<Bucket>& plan, size_t index, const at::Tensor& buffer,
                       const std::vector<at::Tensor>& params, const std::string& label);

// Blocks until `future` completes, at most `timeout`. CommError naming `what` and `rank` when it
// does not complete in time or completes with an error.
void wait_hook_future(const HookFuture& future, std::chrono::milliseconds timeout, const std::string& what, int rank);

// The hook's result for bucket `label`, checked to hold `numel` elements; ConfigError otherwise.
at::Tensor hook_result(CommHook& hook, const HookFuture& future, int64_t numel, const std::string& label);

}  // namespace dtcore
