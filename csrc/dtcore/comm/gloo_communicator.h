// GlooCommunicator: dtcore's collectives on CPU tensors, through the Gloo inside libtorch.
//
// torch's wheel ships Gloo's library but not its headers, so the Gloo process group is created
// on the Python side (torch.distributed.ProcessGroupGloo, on dtcore's rendezvous store) and
// handed over as a c10d::Backend; this class drives it through that interface. Gloo runs each
// collective on its own worker threads, so calls return at once and overlap with the caller.
// Gloo has no average: Avg is a sum divided by the world size when the Work completes.
//
// Ownership: holds a reference to the backend. Thread safety: see communicator.h.
#pragma once

#include <functional>
#include <mutex>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dtcore/comm/communicator.h"

namespace dtcore {

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::Backend> backend, std::chrono::milliseconds timeout);

  std::string_view backend() const override { return "gloo"; }
  void close() override;

 protected:
  std::shared_ptr<Work> start(const Collective& c) override;
  bool accepts_device(const at::Tensor& t) const override { return t.device().is_cpu(); }

 private:
  std::mutex mu_;                              // guards backend_ against close()
  c10::intrusive_ptr<c10d::Backend> backend_;  // null once closed
};

}  // namespace dtcore
