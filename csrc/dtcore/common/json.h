// json_quote(): text as a JSON string literal, for the few JSON documents dtcore writes by hand
// (safetensors headers, flight records).
//
// Quotes, backslashes and control characters are escaped; UTF-8 passes through. (Not named
// quoted(): a call with a std::string would find std::quoted by argument-dependent lookup, which
// escapes no control characters, wherever <iomanip> is included.) Thread safety: a pure function.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace dtcore {

inline std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace dtcore
