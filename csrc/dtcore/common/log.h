// The logging facade: dtcore's only door to spdlog.
//
// Every line carries time, level, rank/world and host. The console shows info and above for the
// ranks chosen by DTCORE_LOG_RANKS (rank 0 by default) and warnings and errors for the others;
// when a log directory is given, each rank also writes every line (debug included) to its own
// timestamped file. Python's `logging.getLogger("dtcore")` forwards into the same sinks
// (python/dtcore/_logging.py), so both languages share one format and one file.
//
// spdlog is included only by log.cpp, which includes no torch header: torch bundles its own fmt.
// Thread safety: write() and the helpers may be called from any thread; configure() is meant
// to be called once per init(), before other threads log, and replaces the sinks atomically.
#pragma once

#include <string>
#include <string_view>

#include "dtcore/common/error.h"

namespace dtcore::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

struct Config {
  int rank = -1;  // -1 before rendezvous: printed as "?"
  int world_size = -1;
  std::string host;
  Level console_level = Level::Info;  // for this rank (already decided from DTCORE_LOG_RANKS)
  std::string log_dir;                // "" = no file
};

// (Re)configures the sinks. Returns the path of this rank's log file, or "" without a log_dir.
// Throws ConfigError when the directory cannot be created or written.
std::string configure(const Config& config);

// Parses "debug" | "info" | "warn" | "error" (case-insensitive); ConfigError otherwise.
Level parse_level(std::string_view text, std::string_view source);
std::string_view level_name(Level level);  // "debug", "info", "warn", "error"

// torch's C++ code logs through c10's logger, which writes to std::cerr; several of its warnings
// embed a c10::Error's text, with the stack trace of where it was thrown (15-30 "frame #N" lines).
// c10d's TCPStore client prints one each time a request fails on a store whose server died
// (`[c10d] sendBytes failed on ...: Broken pipe`), so a rank whose peer served the store got
// dozens of such blocks on its stderr beside dtcore's own error.
//
// Note [C++ stack traces on the console]
// Once configure() has run, each line written to std::cerr goes to the console unchanged, except
// a stack trace: "Exception raised from ...", "frame #N: ..." and "<omitting python frames>"
// lines, and the blank line that ends them. Those go to dtcore's log at debug level (the log file
// when a log directory is set; the console only at DTCORE_LOG_LEVEL=debug) as one record naming
// the line they belong to. So the console keeps the first line of each torch warning, and the
// file the whole of it. TORCH_SHOW_CPP_STACKTRACES=1 (the user asked for C++ traces) leaves
// std::cerr as it is. Python's own output (sys.stderr, tracebacks, dtcore's errors) never passes
// through std::cerr, so nothing of dtcore's is hidden.
// The filter is installed once per process and stays until exit: torch may log until then.

void write(Level level, std::string_view message);
bool enabled(Level level);  // cheap: use before building an expensive message
void flush();

template <typename... Args>
void debug(Args&&... args) {
  if (enabled(Level::Debug)) write(Level::Debug, detail::cat(std::forward<Args>(args)...));
}
template <typename... Args>
void info(Args&&... args) {
  if (enabled(Level::Info)) write(Level::Info, detail::cat(std::forward<Args>(args)...));
}
template <typename... Args>
void warn(Args&&... args) {
  write(Level::Warn, detail::cat(std::forward<Args>(args)...));
}
template <typename... Args>
void error(Args&&... args) {
  write(Level::Error, detail::cat(std::forward<Args>(args)...));
}

}  // namespace dtcore::log
