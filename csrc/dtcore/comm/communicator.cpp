#include "dtcore/comm/communicator.h"

#include <c10/core/ScalarType.h>

#include "dtcore/common/error.h"

namespace dtcore {

ReduceOp parse_reduce_op(std::string_view name) {
  if (name == "sum") return ReduceOp::Sum;
  if (name == "avg" || name == "mean") return ReduceOp::Avg;
  if (name == "max") return ReduceOp::Max;
  if (name == "min") return ReduceOp::Min;
  DTCORE_CHECK(false, ConfigError, "op='", name, "' is not a reduction dtcore knows. Fix: use one of 'sum', 'avg', "
               "'max', 'min'.");
  return ReduceOp::Sum;  // unreachable
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

void Communicator::check_input(const at::Tensor& t, std::string_view what, std::string_view op_name,
                               const ReduceOp* op) const {
  DTCORE_CHECK(t.defined(), ConfigError, op_name, ": ", what, " is an undefined tensor. Fix: pass a tensor that holds data (e.g. torch.zeros(...)).");
  DTCORE_CHECK(accepts_device(t), ConfigError, op_name, ": ", what, " is on ", t.device().str(),
               ", but this job's backend is ", backend(), backend() == "gloo" ? " (CPU tensors)" : " (CUDA tensors)",
               ". Fix: move the tensor (", backend() == "gloo" ? ".cpu()" : ".cuda()",
               ") or initialize with the matching backend (dtcore.init(backend=...)).");
  DTCORE_CHECK(t.is_contiguous(), ConfigError, op_name, ": ", what,
               " is not contiguous. Fix: pass tensor.contiguous() (and copy the result back if needed).");
  DTCORE_CHECK(!t.is_sparse(), ConfigError, op_name, ": ", what, " is sparse; dtcore reduces dense tensors only. Fix: pass tensor.to_dense().");
  if (op != nullptr && *op == ReduceOp::Avg) {
    DTCORE_CHECK(at::isFloatingType(t.scalar_type()), ConfigError, op_name, ": op='avg' needs a floating-point ",
                 "tensor, but ", what, " is ", c10::toString(t.scalar_type()),
                 ". Fix: use op='sum' and divide by the world size yourself, choosing how to round.");
  }
}

void Communicator::check_flat_sizes(const at::Tensor& big, const at::Tensor& small, std::string_view op_name) const {
  DTCORE_CHECK(big.numel() == small.numel() * size_, ConfigError, op_name, ": the large buffer has ", big.numel(),
               " elements but must have world size x ", small.numel(), " = ", small.numel() * size_,
               ". Fix: size it as world_size * shard elements.");
  DTCORE_CHECK(big.scalar_type() == small.scalar_type(), ConfigError, op_name, ": input and output dtypes differ (",
               c10::toString(big.scalar_type()), " vs ", c10::toString(small.scalar_type()), "). Fix: give both buffers the same dtype.");
}

void Communicator::check_root(int root) const {
  DTCORE_CHECK(root >= 0 && root < size_, ConfigError, "broadcast: src=", root, " is not a rank of this job (0..",
               size_ - 1, "). Fix: pass the rank that holds the data, e.g. src=0.");
}

std::string Communicator::describe(std::string_view op_name, uint64_t seq, const at::Tensor& t,
                                   const ReduceOp* op) const {
  std::string out = detail::cat(op_name, " #", seq);
  if (t.defined()) {
    out += detail::cat(" (", c10::toString(t.scalar_type()), "[", t.numel(), "]");
    if (op != nullptr) out += detail::cat(", ", reduce_op_name(*op));
    out += ")";
  }
  return out;
}

}  // namespace dtcore
