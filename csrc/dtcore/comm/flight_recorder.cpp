#include "dtcore/comm/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dtcore/common/error.h"
#include "dtcore/common/json.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/log.h"

namespace dtcore {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string seconds(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", t);
  return buf;
}

}  // namespace

std::string_view state_name(CollectiveRecord::State state) {
  static constexpr std::string_view kNames[] = {"pending", "succeeded", "failed"};  // in State's order
  return kNames[static_cast<int>(state)];
}

void FlightRecorder::issued(CollectiveRecord record) {
  record.started = now_seconds();
  std::lock_guard<std::mutex> lock(mu_);
  records_.push_back(std::move(record));
  while (records_.size() > capacity_) records_.pop_front();
}

void FlightRecorder::finished(uint64_t seq, bool ok) {
  const double now = now_seconds();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Collectives finish in about the order they were issued: search from the newest.
    auto it = std::find_if(records_.rbegin(), records_.rend(), [&](const CollectiveRecord& r) { return r.seq == seq; });
    if (it == records_.rend() || it->state != CollectiveRecord::State::kPending) return;
    it->state = ok ? CollectiveRecord::State::kSucceeded : CollectiveRecord::State::kFailed;
    it->finished = now;
  }
  if (!ok) dump(detail::cat("collective #", seq, " failed"));
}

namespace {

// The recorders SIGUSR2 dumps; see install_dump_signal().
std::mutex g_registry_mu;
std::vector<std::weak_ptr<FlightRecorder>> g_registry;

}  // namespace

void FlightRecorder::set_dump_file(std::string path, int rank, int world, std::string host) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    path_ = std::move(path);
    rank_ = rank;
    world_ = world;
    host_ = std::move(host);
  }
  std::lock_guard<std::mutex> lock(g_registry_mu);
  std::erase_if(g_registry, [](const std::weak_ptr<FlightRecorder>& w) { return w.expired(); });
  g_registry.push_back(weak_from_this());
}

std::string FlightRecorder::dump(std::string_view why) {
  std::lock_guard<std::mutex> once(dump_mu_);
  std::string path, host;
  int rank = 0, world = 0;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (path_.empty()) return "";
    path = path_;
    host = host_;
    rank = rank_;
    world = world_;
    first = !dumped_;
    dumped_ = true;
  }
  const std::vector<std::string> lines = json_lines(rank, world, host);
  const std::string aside = path + ".tmp";
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  {
    std::ofstream out(aside, std::ios::trunc);
    for (const std::string& line : lines) out << line << '\n';
    out.flush();
    if (!out) {
      log::warn("flight record: could not write ", aside, " (", why, "): ", std::strerror(errno),
                "; nothing was dumped. Fix: give the job a writable folder for it, init(log_dir=) or ",
                knobs::kLogDir.name, ".");
      return "";
    }
  }
  std::filesystem::rename(aside, path, ec);
  if (ec) {
    log::warn("flight record: could not rename ", aside, " to ", path, " (", why, "): ", ec.message(),
              "; nothing was dumped. Fix: give the job a writable folder for it, init(log_dir=) or ",
              knobs::kLogDir.name, ".");
    return "";
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (first) {
    log::warn("flight record of rank ", rank, "'s last ", lines.size(), " collectives written to ", path, " (", why,
              "). With every rank's: python -m dtcore.check --analyze ", dir);
  } else {
    log::debug("flight record of rank ", rank, " written again to ", path, " (", why, ")");
  }
  return path;
}

namespace {

int g_signal_pipe[2] = {-1, -1};

void on_dump_signal(int) {
  const char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);  // async-signal-safe; a full pipe drops it
}

void dump_loop() {
  for (;;) {
    char byte;
    ssize_t n = ::read(g_signal_pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::vector<std::shared_ptr<FlightRecorder>> recorders;
    {
      std::lock_guard<std::mutex> lock(g_registry_mu);
      for (auto& w : g_registry) {
        if (auto r = w.lock()) recorders.push_back(std::move(r));
      }
    }
    for (auto& r : recorders) r->dump("SIGUSR2");
  }
}

}  // namespace

bool install_dump_signal() {
  static const bool installed = [] {
    struct sigaction old{};
    if (::sigaction(SIGUSR2, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) {
      log::debug("flight record: SIGUSR2 has a handler already; the record is dumped on failures only");
      return false;
    }
    if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
      log::warn("flight record: SIGUSR2 cannot dump the record (pipe2: ", std::strerror(errno),
                "); it is still dumped on every failure");
      return false;
    }
    ::fcntl(g_signal_pipe[1], F_SETFL, O_NONBLOCK);
    std::thread(dump_loop).detach();  // lives as long as the process, blocked in read()
    struct sigaction sa{};
    sa.sa_handler = on_dump_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    return ::sigaction(SIGUSR2, &sa, nullptr) == 0;
  }();
  return installed;
}

std::vector<CollectiveRecord> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {records_.begin(), records_.end()};
}

std::vector<std::string> FlightRecorder::json_lines(int rank, int world, const std::string& host) const {
  std::vector<std::string> out;
  for (const CollectiveRecord& r : snapshot()) {
    char signature[24];
    std::snprintf(signature, sizeof signature, "%016llx", static_cast<unsigned long long>(r.signature));
    out.push_back(detail::cat("{\"rank\": ", rank, ", \"world\": ", world, ", \"host\": ", json_quote(host),
                              ", \"seq\": ", r.seq, ", \"op\": ", json_quote(r.op),
                              ", \"detail\": ", json_quote(r.detail), ", \"label\": ", json_quote(r.label),
                              ", \"signature\": \"", signature, "\", \"started\": ", seconds(r.started),
                              ", \"finished\": ", seconds(r.finished), ", \"state\": \"", state_name(r.state), "\"}"));
  }
  return out;
}

}  // namespace dtcore
