// See log.h. This is the only file that includes spdlog, and it includes no torch header.
#include "dtcore/common/log.h"

#include "dtcore/common/knobs.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <streambuf>
#include <string>

#include <unistd.h>

namespace dtcore::log {
namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::Debug: return spdlog::level::debug;
    case Level::Info: return spdlog::level::info;
    case Level::Warn: return spdlog::level::warn;
    case Level::Error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

// Why a mutex and a shared_ptr copy: configure() may swap the logger while a communication
// thread writes; each writer holds its own reference for the duration of one line.
std::mutex g_mutex;
std::shared_ptr<spdlog::logger> g_logger;
std::atomic<int> g_min_level{static_cast<int>(Level::Info)};  // lowest level any sink takes

// See Note [C++ stack traces on the console] in log.h.
bool is_trace_line(std::string_view line) {
  return line.starts_with("frame #") || line.starts_with("Exception raised from ") ||
         line.starts_with("<omitting python frames>");
}

// A streambuf in front of std::cerr's own: whole lines to the console, trace lines to the log.
class TraceFilter : public std::streambuf {
 public:
  explicit TraceFilter(std::streambuf* console) : console_(console) {}

 protected:
  int_type overflow(int_type ch) override {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
    char c = traits_type::to_char_type(ch);
    xsputn(&c, 1);
    return ch;
  }

  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::streamsize i = 0; i < n; ++i) {
      line_.push_back(s[i]);
      if (s[i] == '\n') end_line();
    }
    return n;
  }

  int sync() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!line_.empty() && !is_trace_line(line_)) {  // a partial line flushed on purpose: show it now
      console_->sputn(line_.data(), static_cast<std::streamsize>(line_.size()));
      last_ = line_;
      line_.clear();
    }
    end_block();
    return console_->pubsync();
  }

 private:
  void end_line() {
    std::string_view text(line_.data(), line_.size() - 1);  // without the '\n'
    if (is_trace_line(text) || (!block_.empty() && text.empty())) {
      if (block_.empty()) block_ = "C++ stack trace of the torch message \"" + last_ + "\" (cut from the console):";
      if (!text.empty()) block_.append("\n").append(text);
    } else {
      end_block();
      console_->sputn(line_.data(), static_cast<std::streamsize>(line_.size()));
      last_.assign(text);
    }
    line_.clear();
  }

  void end_block() {
    if (block_.empty()) return;
    write(Level::Debug, block_);
    flush();  // the process that printed it is often about to die
    block_.clear();
  }

  std::streambuf* console_;
  std::mutex mutex_;   // torch logs from many threads
  std::string line_;   // the line being written
  std::string last_;   // the last line shown: the message a trace belongs to
  std::string block_;  // the trace lines so far, as one log record
};

std::string pattern_for(const Config& c) {
  std::string who = c.rank < 0 ? std::string("?") : std::to_string(c.rank);
  std::string world = c.world_size < 0 ? std::string("?") : std::to_string(c.world_size);
  // [time] [level] [rank r/w host] message
  return "[%Y-%m-%d %H:%M:%S.%e] [%L] [rank " + who + "/" + world + " " + c.host + "] %v";
}

std::shared_ptr<spdlog::logger> make_default() {
  Config c;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  c.host = host;
  auto console = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  console->set_level(to_spdlog(c.console_level));
  auto logger = std::make_shared<spdlog::logger>("dtcore", console);
  logger->set_pattern(pattern_for(c));
  logger->set_level(spdlog::level::debug);
  g_min_level = static_cast<int>(c.console_level);
  return logger;
}

std::shared_ptr<spdlog::logger> current() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_logger) {
    g_logger = make_default();
  }
  return g_logger;
}

std::string timestamp() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

}  // namespace

Level parse_level(std::string_view text, std::string_view source) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (t == "debug") return Level::Debug;
  if (t == "info") return Level::Info;
  if (t == "warn" || t == "warning") return Level::Warn;
  if (t == "error") return Level::Error;
  DTCORE_CHECK(false, ConfigError, source, "='", text,
               "' is not a log level. Fix: use one of debug, info, warn, error.");
  return Level::Info;  // unreachable
}

std::string_view level_name(Level level) {
  static constexpr std::string_view kNames[] = {"debug", "info", "warn", "error"};  // in Level's order
  return kNames[static_cast<int>(level)];
}

// Puts TraceFilter in front of std::cerr, once (see Note [C++ stack traces on the console]).
static void install_cerr_filter() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* show = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
    if (show != nullptr && std::string_view(show) == "1") return;
    static TraceFilter filter(std::cerr.rdbuf());
    std::cerr.rdbuf(&filter);
  });
}

std::string configure(const Config& config) {
  install_cerr_filter();
  std::vector<spdlog::sink_ptr> sinks;
  auto console = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  console->set_level(to_spdlog(config.console_level));
  sinks.push_back(console);
  int min_level = static_cast<int>(config.console_level);

  std::string path;
  if (!config.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.log_dir, ec);
    DTCORE_CHECK(!ec, ConfigError, "log_dir='", config.log_dir, "' cannot be created: ", ec.message(),
                 ". Fix: pass a writable directory as init(log_dir=...) or ", knobs::kLogDir.name, ".");
    std::string who = config.rank < 0 ? std::string("unknown") : std::to_string(config.rank);
    path = (std::filesystem::path(config.log_dir) / ("dtcore-" + timestamp() + "-rank" + who + ".log")).string();
    try {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
      file->set_level(spdlog::level::debug);
      sinks.push_back(file);
    } catch (const spdlog::spdlog_ex& e) {
      DTCORE_CHECK(false, ConfigError, "log file '", path, "' cannot be opened: ", e.what(),
                   ". Fix: pass a writable directory as init(log_dir=...) or ", knobs::kLogDir.name, ".");
    }
    min_level = static_cast<int>(Level::Debug);
  }

  auto logger = std::make_shared<spdlog::logger>("dtcore", sinks.begin(), sinks.end());
  logger->set_pattern(pattern_for(config));
  logger->set_level(spdlog::level::debug);
  logger->flush_on(spdlog::level::warn);  // what precedes a failure must reach the file
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_logger) {
      g_logger->flush();
    }
    g_logger = std::move(logger);
    g_min_level = min_level;
  }
  return path;
}

bool enabled(Level level) { return static_cast<int>(level) >= g_min_level.load(std::memory_order_relaxed); }

void write(Level level, std::string_view message) { current()->log(to_spdlog(level), "{}", message); }

void flush() { current()->flush(); }

}  // namespace dtcore::log
