#include "dtcore/comm/communicator.h"

#include <c10/core/ScalarType.h>

#include "dtcore/common/dtype.h"
#include "dtcore/common/env.h"
#include "dtcore/common/error.h"

namespace dtcore {

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

std::string_view collective_name(CollectiveKind kind) {
  static constexpr std::string_view kNames[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                "barrier"};  // in CollectiveKind's order
  return kNames[static_cast<int>(kind)];
}

std::shared_ptr<Work> Communicator::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  check_input(tensor, "the tensor", "all_reduce", &op);
  return issue(Collective{CollectiveKind::AllReduce, 0, "", tensor, at::Tensor(), op, 0});
}

std::shared_ptr<Work> Communicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_input(output, "the output", "reduce_scatter", &op);
  check_input(input, "the input", "reduce_scatter", &op);
  check_flat_sizes(input, "input", output, "output", "reduce_scatter");
  return issue(Collective{CollectiveKind::ReduceScatter, 0, "", input, output, op, 0});
}

std::shared_ptr<Work> Communicator::all_gather(const at::Tensor& output, const at::Tensor& input) {
  check_input(output, "the output", "all_gather");
  check_input(input, "the input", "all_gather");
  check_flat_sizes(output, "output", input, "input", "all_gather");
  return issue(Collective{CollectiveKind::AllGather, 0, "", input, output, ReduceOp::Sum, 0});
}

std::shared_ptr<Work> Communicator::broadcast(const at::Tensor& tensor, int root) {
  check_input(tensor, "the tensor", "broadcast");
  DTCORE_CHECK(root >= 0 && root < size_, ConfigError, "broadcast: src=", root, " is not a rank of this job (0..",
               size_ - 1, "). Fix: pass the rank that holds the data, e.g. src=0.");
  return issue(Collective{CollectiveKind::Broadcast, 0, "", tensor, at::Tensor(), ReduceOp::Sum, root});
}

std::shared_ptr<Work> Communicator::barrier() {
  return issue(Collective{CollectiveKind::Barrier, 0, "", at::Tensor(), at::Tensor(), ReduceOp::Sum, 0});
}

std::shared_ptr<Work> Communicator::issue(Collective c) {
  c.seq = seq_.fetch_add(1) + 1;
  if (health_) health_->record_progress(c.seq);
  // "all_reduce #12 (float32[4096], avg)"
  c.what = detail::cat(collective_name(c.kind), " #", c.seq);
  if (c.input.defined()) {
    c.what += detail::cat(" (", dtype_name(c.input.scalar_type()), "[", c.input.numel(), "]");
    if (c.kind == CollectiveKind::AllReduce || c.kind == CollectiveKind::ReduceScatter) {
      c.what += detail::cat(", ", reduce_op_name(c.op));
    }
    c.what += ")";
  }
  return start(c);
}

}  // namespace dtcore
