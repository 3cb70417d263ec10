#include "dtcore/checkpoint/copy_plan.h"

#include <cstring>

#include <ATen/ATen.h>

#include "dtcore/common/error.h"

namespace dtcore::checkpoint {

namespace {

void check_pair(const at::Tensor& destination, const at::Tensor& source, std::size_t index) {
  DTCORE_CHECK(destination.device().is_cpu() && destination.is_contiguous() && destination.scalar_type() == at::kByte,
               CheckpointError, "in-memory checkpoint: copy ", index,
               "'s destination is not a contiguous CPU byte tensor (a dtcore bug: it is a view of the slot's file).");
  DTCORE_CHECK(source.is_contiguous() && source.nbytes() == destination.nbytes(), CheckpointError,
               "in-memory checkpoint: copy ", index, " has a source of ", source.nbytes(), " bytes",
               source.is_contiguous() ? "" : " (not contiguous)", " for a destination of ", destination.nbytes(),
               " (a dtcore bug: the state changed its layout without being laid out again).");
  const std::size_t end = (source.storage_offset() * source.element_size()) + source.nbytes();
  DTCORE_CHECK(source.has_storage() && source.storage().nbytes() >= end, CheckpointError, "in-memory checkpoint: copy ",
               index, "'s source ends at byte ", end, " of a storage of ",
               source.has_storage() ? source.storage().nbytes() : 0,
               " (resized since it was laid out: a dtcore bug, the layout check missed it).");
}

}  // namespace

CopyPlan::CopyPlan(std::vector<at::Tensor> destinations, std::vector<at::Tensor> sources)
    : destinations_(std::move(destinations)), sources_(std::move(sources)) {
  DTCORE_CHECK(sources_.size() <= destinations_.size(), CheckpointError, "in-memory checkpoint: ", sources_.size(),
               " sources for ", destinations_.size(), " destinations (a dtcore bug).");
  for (std::size_t i = 0; i < sources_.size(); ++i) check_pair(destinations_[i], sources_[i], i);
}

void CopyPlan::copy(const at::Tensor& destination, const at::Tensor& source, std::size_t index) {
  check_pair(destination, source, index);
  if (source.device().is_cpu()) {
    std::memcpy(destination.data_ptr(), source.const_data_ptr(), source.nbytes());
  } else {
    destination.copy_(source.reshape({-1}).view(at::kByte));
  }
}

void CopyPlan::run(const std::vector<at::Tensor>& tail) const {
  DTCORE_CHECK(tail.size() == tail_size(), CheckpointError, "in-memory checkpoint: ", tail.size(),
               " tensors taken at this save for ", tail_size(), " places (a dtcore bug).");
  for (std::size_t i = 0; i < sources_.size(); ++i) copy(destinations_[i], sources_[i], i);
  for (std::size_t j = 0; j < tail.size(); ++j) copy(destinations_[sources_.size() + j], tail[j], sources_.size() + j);
}

std::size_t CopyPlan::bytes() const {
  std::size_t total = 0;
  for (const at::Tensor& destination : destinations_) total += destination.nbytes();
  return total;
}

}  // namespace dtcore::checkpoint
