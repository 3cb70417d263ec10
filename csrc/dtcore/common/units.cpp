#include "dtcore/common/units.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "dtcore/common/env.h"
#include "dtcore/common/error.h"

namespace dtcore {
namespace {

struct Unit {
  std::string_view name;  // lower case
  double scale;
};

// SI (powers of 1000) and IEC (powers of 1024), as the standards define them.
constexpr Unit kUnits[] = {
    {"", 1.0},    {"b", 1.0},      {"kb", 1e3},        {"mb", 1e6},           {"gb", 1e9},
    {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad_size(std::string_view text, std::string_view what, std::string_view why) {
  DTCORE_CHECK(false, ConfigError, what, " '", text, "' is not a size in bytes", why,
               ". Fix: pass a positive number of bytes or a number with a unit, e.g. 2GB, 512MB (decimal: 1 GB = "
               "10^9 bytes) or 1.5GiB, 768MiB (binary: 1 GiB = 2^30 bytes).");
}

}  // namespace

int64_t parse_bytes(std::string_view text, std::string_view what) {
  std::string_view s = trim(text);
  size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) ++digits;
  std::string number(s.substr(0, digits));
  std::string unit = ascii_lower(trim(s.substr(digits)));
  double value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || ec != std::errc() || end != number.data() + number.size()) bad_size(text, what, "");
  if (unit == "k" || unit == "m" || unit == "g" || unit == "t") {
    bad_size(text, what, ": a bare K, M, G or T is ambiguous (powers of 1000 or of 1024?)");
  }
  const Unit* found = std::find_if(std::begin(kUnits), std::end(kUnits), [&](const Unit& u) { return u.name == unit; });
  if (found == std::end(kUnits)) bad_size(text, what, "");
  if (found->scale == 1.0 && value != std::floor(value)) bad_size(text, what, ": a byte count is a whole number");
  double bytes = std::floor(value * found->scale);  // 1.1GiB: down to a whole byte
  if (!(bytes >= 1.0) || bytes > 9.0e18) bad_size(text, what, "");
  return static_cast<int64_t>(bytes);
}

std::string format_bytes(int64_t bytes) {
  static constexpr std::pair<const char*, uint64_t> kBinary[] = {
      {"TiB", uint64_t{1} << 40}, {"GiB", uint64_t{1} << 30}, {"MiB", uint64_t{1} << 20}, {"KiB", uint64_t{1} << 10}};
  const char* sign = bytes < 0 ? "-" : "";
  const uint64_t magnitude = bytes < 0 ? uint64_t{0} - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  for (size_t i = 0; i < std::size(kBinary); ++i) {
    const auto& [name, scale] = kBinary[i];
    if (magnitude < scale) continue;
    if (magnitude % scale == 0) return detail::cat(sign, magnitude / scale, " ", name);
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(magnitude) / static_cast<double>(scale));
    // 1048575 B is 1023.99... KiB, which one decimal rounds to 1024.0: that is 1.0 MiB.
    if (i > 0 && std::string_view(buf) == "1024.0") return detail::cat(sign, "1.0 ", kBinary[i - 1].first);
    return detail::cat(sign, buf, " ", name);
  }
  return detail::cat(sign, magnitude, " B");
}

std::chrono::milliseconds seconds_to_timeout(double seconds, std::string_view what) {
  DTCORE_CHECK(std::isfinite(seconds) && seconds > 0, ConfigError, what, "=", seconds,
               " is not a positive number of seconds. Fix: pass e.g. 300.");
  DTCORE_CHECK(seconds <= kMaxTimeoutSeconds, ConfigError, what, "=", seconds,
               " seconds is longer than dtcore can wait "
               "(at most ",
               kMaxTimeoutSeconds, " s, about 31 years). Fix: pass a number of seconds up to that.");
  return std::max(std::chrono::milliseconds(1), std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0)));
}

}  // namespace dtcore
