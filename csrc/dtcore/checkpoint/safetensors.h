// Writing safetensors files: the tensor format of checkpoints, readable by the `safetensors`
// library (and anything else that reads the format) without dtcore and without pickle.
//
// The format: 8 bytes little-endian N, then N bytes of a JSON header
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
// padded with spaces so that the data starts 8-byte aligned, then the tensors' bytes, back to
// back in the order given (offsets are relative to the start of the data). A reader checks that
// the offsets tile the data exactly, so a truncated file is refused by the reader too.
//
// write_safetensors() writes through AtomicFile: the file appears whole or not at all, and its
// digest is computed on the way.
//
// Ownership: the entries point at memory the caller keeps alive during the call. Thread safety:
// pure functions; calls on different files may run concurrently (the GIL is not needed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "dtcore/checkpoint/atomic_file.h"

namespace dtcore::checkpoint {

struct TensorEntry {
  std::string name;
  std::string dtype;  // the format's code: "F32", "BF16", "I64", "U8", "BOOL", ...
  std::vector<std::int64_t> shape;
  const std::uint8_t* data = nullptr;  // nbytes of the tensor's elements, row-major
  std::size_t nbytes = 0;
};

// The 8-byte length and the padded header for `entries` (no tensor data).
std::string safetensors_header(const std::vector<TensorEntry>& entries,
                               const std::map<std::string, std::string>& metadata);

FileDigest write_safetensors(const std::string& path, const std::vector<TensorEntry>& entries,
                             const std::map<std::string, std::string>& metadata);

// The format's code for a torch dtype ("F32" for torch.float32); CheckpointError for a dtype the
// format has no code for (complex, quantized), naming it.
std::string safetensors_dtype(c10::ScalarType type);

}  // namespace dtcore::checkpoint
