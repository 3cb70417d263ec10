#include "dtcore/checkpoint/safetensors.h"

#include <cstdio>
#include <set>

#include "dtcore/common/dtype.h"
#include "dtcore/common/error.h"
#include "dtcore/common/json.h"

namespace dtcore::checkpoint {

std::string safetensors_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Double: return "F64";
    case c10::ScalarType::Float: return "F32";
    case c10::ScalarType::Half: return "F16";
    case c10::ScalarType::BFloat16: return "BF16";
    case c10::ScalarType::Long: return "I64";
    case c10::ScalarType::Int: return "I32";
    case c10::ScalarType::Short: return "I16";
    case c10::ScalarType::Char: return "I8";
    case c10::ScalarType::Byte: return "U8";
    case c10::ScalarType::Bool: return "BOOL";
    case c10::ScalarType::Float8_e4m3fn: return "F8_E4M3";
    case c10::ScalarType::Float8_e5m2: return "F8_E5M2";
    default:
      DTCORE_CHECK(false, CheckpointError, "a checkpoint cannot hold tensors of ", dtype_name(type),
                   ": safetensors has no code for it. Fix: convert that tensor (e.g. complex to a real view with "
                   "torch.view_as_real) before saving.");
  }
}

std::string safetensors_header(const std::vector<TensorEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      json += (first ? "" : ",") + json_quote(key) + ":" + json_quote(value);
      first = false;
    }
    json += "}";
  }
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const TensorEntry& e : entries) {
    DTCORE_CHECK(names.insert(e.name).second, CheckpointError, "safetensors: the tensor name '", e.name,
                 "' appears twice (a dtcore bug: checkpoint keys are unique).");
    DTCORE_CHECK(e.name != "__metadata__", CheckpointError, "safetensors: '__metadata__' is not a tensor name.");
    json += (json.size() > 1 ? "," : "") + json_quote(e.name) + ":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
    for (std::size_t i = 0; i < e.shape.size(); ++i) json += (i ? "," : "") + std::to_string(e.shape[i]);
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e.nbytes) + "]}";
    offset += e.nbytes;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);  // little-endian
  return out + json;
}

FileDigest write_safetensors(const std::string& path, const std::vector<TensorEntry>& entries,
                             const std::map<std::string, std::string>& metadata) {
  std::string header = safetensors_header(entries, metadata);
  AtomicFile file(path);
  file.write(header);
  for (const TensorEntry& e : entries) file.write(std::span(e.data, e.nbytes));
  return file.commit();
}

}  // namespace dtcore::checkpoint
