// Units as users write them: sizes in bytes and durations in seconds.
//
// One parser and one formatter for sizes, used by every part of dtcore (activation budgets, the
// checker's sweep sizes, messages and tables), with the SI and IEC meanings: kB/MB/GB/TB are
// powers of 1000, KiB/MiB/GiB/TiB powers of 1024. A bare K, M or G is refused as ambiguous rather
// than guessed. The formatter writes binary units, exact when the size is a whole number of them.
// Thread safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtcore {

// "2GB" -> 2'000'000'000, "1.5GiB" -> 1'610'612'736, "4096" and "4096B" -> 4096. Case-insensitive
// units, blanks allowed around the number and the unit; a fraction of a larger unit is rounded
// down to a whole byte. ConfigError naming `what` and the value for anything else: a fractional
// byte count ("1.5B"), a size under one byte.
int64_t parse_bytes(std::string_view text, std::string_view what);

// 8 -> "8 B", 65536 -> "64 KiB", 1610612736 -> "1.5 GiB", 100000 -> "97.7 KiB".
std::string format_bytes(int64_t bytes);

// A number of seconds as a timeout: positive and at most kMaxTimeoutSeconds (ConfigError naming
// `what` otherwise), and never rounded down to 0 ms, which the engines read as "no timeout".
inline constexpr double kMaxTimeoutSeconds = 1e9;  // about 31 years: "forever" for a job, and far from overflow
std::chrono::milliseconds seconds_to_timeout(double seconds, std::string_view what);

}  // namespace dtcore
