// Sourced<T> and Problem: a value that knows where it came from, and what is wrong with one.
//
// dtcore reads each setting and each field of the job's shape from several places: an init()
// argument beats a DTCORE_* variable, which beats the launcher's variable, which beats a value
// derived from the others or a default. Every such value carries its source ("RANK",
// "init(timeout=)", "DTCORE_TIMEOUT", "default", "derived: ..."), so that an error names what the
// user must change. A Problem is one such error kept as data: the resource checker reports each
// as an item, init() raises them all in one ConfigError. Thread safety: plain values.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "dtcore/common/error.h"

namespace dtcore {

template <typename T>
struct Sourced {
  T value{};
  std::string source;  // "RANK", "DTCORE_RANK", "init(rank=)", "derived: ...", "default: ..."
};

// True when `source` is something a user sets by name: a variable ("LOCAL_RANK") or an argument
// ("init(rank=)"); false for "default: ..." and "derived: ...".
inline bool settable(std::string_view source) {
  if (source.starts_with("init(") || source.starts_with("--")) return true;
  if (source.empty()) return false;
  for (char ch : source) {
    if (!((ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_')) return false;
  }
  return true;
}

// How the user wrote a text value: "init(backend='nccl')" or "DTCORE_BACKEND='nccl'"; a value
// that was not set by name is just quoted.
inline std::string as_written(std::string_view source, std::string_view text) {
  if (source.starts_with("init(") && source.ends_with("=)")) {
    return detail::cat(source.substr(0, source.size() - 1), "'", text, "')");
  }
  if (settable(source)) return detail::cat(source, "='", text, "'");
  return detail::cat("'", text, "'");
}

// "local_world_size" -> "local world size", for a field named in a message.
inline std::string in_words(std::string_view field) {
  std::string words(field);
  for (char& ch : words) ch = ch == '_' ? ' ' : ch;
  return words;
}

// "LOCAL_RANK=9" for a value the user set; "local rank 0 (derived: rank - node rank * ...)" for
// one dtcore worked out, so that a message never reads as if a variable were named "derived".
template <typename T>
std::string named(std::string_view label, const Sourced<T>& f) {
  if (settable(f.source)) return detail::cat(f.source, "=", f.value);
  return detail::cat(label, " ", f.value, " (", f.source, ")");
}

struct Problem {
  std::string field;     // what is wrong, as an identifier: "local_rank", "timeout"
  std::string variable;  // where the value came from, e.g. "LOCAL_RANK" or "derived: ..."
  std::string value;     // as seen
  std::string message;   // what is wrong
  std::string fix;       // what to do

  // A name a user recognizes: the variable or argument to change, else the field in words.
  std::string label() const { return settable(variable) ? variable : in_words(field); }
  std::string to_string() const { return detail::cat(message, " Fix: ", fix); }
};

}  // namespace dtcore
