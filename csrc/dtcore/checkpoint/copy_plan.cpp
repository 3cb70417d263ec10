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
  for (std::size_t i = 0; i < sources_.size(); ++i) {
    const at::Tensor& source = sources_[i];
    check_pair(destinations_[i], source, i);
    if (!source.device().is_cpu()) {
      device_sources_.push_back(i);
      continue;
    }
    const c10::StorageImpl* storage = source.storage().unsafeGetStorageImpl();
    spans_.push_back({static_cast<std::uint8_t*>(destinations_[i].data_ptr()),
                      static_cast<const std::uint8_t*>(source.const_data_ptr()), source.nbytes(), storage,
                      storage->data(), storage->nbytes()});
  }
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
  for (std::size_t i = 0; i < spans_.size(); ++i) {
    const Span& span = spans_[i];
    DTCORE_CHECK(span.storage->data() == span.base && span.storage->nbytes() == span.storage_bytes, CheckpointError,
                 "in-memory checkpoint: a source's storage (", span.storage_bytes, " bytes when laid out) is now of ",
                 span.storage->nbytes(),
                 " bytes at another address: freed and allocated anew, which the layout "
                 "check missed (a dtcore bug).");
    std::memcpy(span.to, span.from, span.bytes);
  }
  for (std::size_t i : device_sources_) copy(destinations_[i], sources_[i], i);
  for (std::size_t j = 0; j < tail.size(); ++j) copy(destinations_[sources_.size() + j], tail[j], sources_.size() + j);
}

std::size_t CopyPlan::bytes() const {
  std::size_t total = 0;
  for (const at::Tensor& destination : destinations_) total += destination.nbytes();
  return total;
}

}  // namespace dtcore::checkpoint
