#include "dtcore/comm/health.h"

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "dtcore/bootstrap/roster.h"
#include "dtcore/common/c10_error.h"
#include "dtcore/common/call_until.h"
#include "dtcore/common/error.h"
#include "dtcore/common/log.h"
#include "dtcore/common/units.h"

namespace dtcore {
namespace {

std::string key_of(size_t rank) { return "health/" + std::to_string(rank); }

}  // namespace

HealthMonitor::HealthMonitor(c10::intrusive_ptr<c10d::Store> beat_store, c10::intrusive_ptr<c10d::Store> sample_store,
                             int rank, std::vector<PeerInfo> peers, std::chrono::milliseconds interval,
                             std::string store_owner)
    : rank_(rank),
      peers_(std::move(peers)),
      interval_(interval),
      request_bound_(std::max(interval * 5, std::chrono::milliseconds(5000))),
      store_owner_(std::move(store_owner)),
      beat_store_(std::move(beat_store)),
      sample_store_(std::move(sample_store)) {
  beat_store_->setTimeout(request_bound_);
  sample_store_->setTimeout(request_bound_);
  beat_once();  // present before init() returns, so a later diagnosis finds this rank
  thread_ = std::thread([this] { loop(); });
}

std::shared_ptr<HealthMonitor> HealthMonitor::for_rendezvous(Rendezvous& rendezvous, const Settings& settings) {
  const auto interval = seconds_to_timeout(settings.heartbeat_interval_s.value, settings.heartbeat_interval_s.source);
  std::vector<PeerInfo> peers;
  for (const auto& e : rendezvous.roster()) peers.push_back(PeerInfo{e.host, e.pid});
  auto beat = rendezvous.new_connection();
  auto sample = rendezvous.new_connection();
  return std::make_shared<HealthMonitor>(std::move(beat), std::move(sample), rendezvous.rank(), std::move(peers),
                                         interval, rendezvous.store_owner());
}

HealthMonitor::~HealthMonitor() { close(); }

void HealthMonitor::close() {
  std::lock_guard<std::mutex> once(close_mu_);
  closed_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(beat_mu_);
    beat_store_.reset();
  }
  std::lock_guard<std::mutex> lock(sample_mu_);
  sample_store_.reset();
}

void HealthMonitor::beat_once() {
  std::string value = std::to_string(++beats_) + ":" + std::to_string(progress_.load(std::memory_order_relaxed));
  std::lock_guard<std::mutex> lock(beat_mu_);
  if (!beat_store_) return;  // closed
  beat_store_->set(key_of(static_cast<size_t>(rank_)), std::vector<uint8_t>(value.begin(), value.end()));
}

void HealthMonitor::loop() {
  bool failing = false;  // log a run of failures once, not every interval
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (cv_.wait_for(lock, interval_, [this] { return stop_; })) break;
    lock.unlock();
    try {
      beat_once();
      failing = false;
    } catch (const std::exception& e) {
      // Keep trying: a passing hiccup must not make this live rank look dead to the others. If
      // the server is gone for good, every other rank's diagnosis says so anyway.
      if (!failing) log::debug("health: a heartbeat failed (will retry): ", error_text(e));
      failing = true;
    }
    lock.lock();
  }
}

std::vector<HealthMonitor::Sample> HealthMonitor::sample(c10d::Store& store, size_t world) {
  std::vector<std::string> keys;
  for (size_t r = 0; r < world; ++r) keys.push_back(key_of(r));
  std::vector<std::vector<uint8_t>> values(world);
  if (store.check(keys)) {
    values = store.multiGet(keys);  // one round trip: the common case
  } else {
    for (size_t r = 0; r < world; ++r) {
      if (store.check({keys[r]})) values[r] = store.get(keys[r]);  // never get() a missing key: it blocks
    }
  }
  std::vector<Sample> out(world);
  for (size_t r = 0; r < world; ++r) {
    std::string v(values[r].begin(), values[r].end());
    auto colon = v.find(':');
    if (colon == std::string::npos) continue;
    out[r] = Sample{true, std::stoull(v.substr(0, colon)), std::stoull(v.substr(colon + 1))};
  }
  return out;
}

std::string HealthMonitor::diagnose(uint64_t failing_seq, const std::string& op_name) {
  c10::intrusive_ptr<c10d::Store> store;
  {
    std::lock_guard<std::mutex> lock(sample_mu_);
    store = sample_store_;
  }
  if (!store || closed_) return "";

  // Sampled on a detached thread: if the server is stopped (not gone), c10d's client waits for a
  // reply without bound, and this rank must still raise its error (see "Why two connections").
  using Samples = std::pair<std::vector<Sample>, std::vector<Sample>>;
  const auto wait = interval_ * 2 + interval_ / 5;
  const size_t world = peers_.size();
  std::string error;
  std::optional<Samples> samples = call_until<Samples>(
      std::chrono::steady_clock::now() + wait + request_bound_ * 2,
      [store, wait, world] {
        Samples out;
        out.first = sample(*store, world);
        std::this_thread::sleep_for(wait);
        out.second = sample(*store, world);
        return out;
      },
      error);
  if (closed_) return "";  // shut down meanwhile: not a finding
  if (!error.empty()) {
    return detail::cat("health check: the rendezvous store is unreachable (", error, "), so ", store_owner_,
                       " has exited or its host is down; look at its error first.");
  }
  if (!samples) {
    return detail::cat("health check: the rendezvous store did not answer within ",
                       std::chrono::duration<double>(wait + request_bound_ * 2).count(), " s, so ", store_owner_,
                       " is stopped or its host is unreachable; look at it first.");
  }
  std::vector<int> dead, stalled;
  std::string lines;
  for (size_t i = 0; i < world; ++i) {
    int r = static_cast<int>(i);
    if (r == rank_) continue;
    const PeerInfo& p = peers_[i];
    const Sample& a = samples->first[i];
    const Sample& b = samples->second[i];
    if (!b.present || b.beat == a.beat) {
      dead.push_back(r);
      lines += detail::cat("\n  - rank ", r, " (host ", p.host, ", pid ", p.pid, "): no heartbeat for ",
                           std::chrono::duration<double>(wait).count(),
                           " s; the process has exited or its host is unreachable");
    } else if (b.seq < failing_seq) {
      stalled.push_back(r);
      lines += detail::cat("\n  - rank ", r, " (host ", p.host, ", pid ", p.pid, "): alive, but has not started ",
                           op_name, " #", failing_seq, " (its last collective is #", b.seq,
                           "); it is stalled, or its code took another path");
    }
  }
  if (lines.empty()) return "";
  return detail::cat(
      "health check on rank ", rank_, ":", lines,
      dead.empty() ? "" : detail::cat("\n  dead: rank", dead.size() > 1 ? "s " : " ", format_ranks(dead)),
      stalled.empty() ? "" : detail::cat("\n  stalled: rank", stalled.size() > 1 ? "s " : " ", format_ranks(stalled)));
}

}  // namespace dtcore
