#include "dtcore/comm/health.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include "dtcore/bootstrap/roster.h"
#include "dtcore/common/error.h"
#include "dtcore/common/log.h"

namespace dtcore {
namespace {
std::string key_of(int rank) { return "health/" + std::to_string(rank); }
}  // namespace

HealthMonitor::HealthMonitor(c10::intrusive_ptr<c10d::Store> store, int rank, std::vector<PeerInfo> peers,
                             std::chrono::milliseconds interval, std::string store_owner)
    : store_(std::move(store)),
      rank_(rank),
      peers_(std::move(peers)),
      interval_(interval),
      store_owner_(std::move(store_owner)) {
  // Each request on this private connection is bounded, so that an unreachable server costs a
  // few seconds per beat and close() never waits on a request for the whole job timeout.
  store_->setTimeout(std::max(interval_ * 5, std::chrono::milliseconds(5000)));
  beat_once();  // present before init() returns, so a later diagnosis finds this rank
  thread_ = std::thread([this] { loop(); });
}

std::shared_ptr<HealthMonitor> HealthMonitor::for_rendezvous(Rendezvous& rendezvous, std::chrono::milliseconds interval) {
  std::vector<PeerInfo> peers;
  for (const auto& e : rendezvous.roster()) peers.push_back(PeerInfo{e.host, e.pid});
  return std::make_shared<HealthMonitor>(rendezvous.new_connection(), rendezvous.rank(), std::move(peers), interval,
                                         rendezvous.store_owner());
}

HealthMonitor::~HealthMonitor() { close(); }

void HealthMonitor::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(store_mu_);
  store_.reset();
}

void HealthMonitor::beat_once() {
  std::string value = std::to_string(++beats_) + ":" + std::to_string(progress_.load(std::memory_order_relaxed));
  std::lock_guard<std::mutex> lock(store_mu_);
  if (!store_) return;  // closed
  store_->set(key_of(rank_), std::vector<uint8_t>(value.begin(), value.end()));
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
      if (!failing) {
        log::debug("health: a heartbeat failed (will retry): ",
                   dynamic_cast<const c10::Error*>(&e) ? static_cast<const c10::Error&>(e).what_without_backtrace()
                                                      : std::string(e.what()));
      }
      failing = true;
    }
    lock.lock();
  }
}

std::vector<HealthMonitor::Sample> HealthMonitor::sample() {
  std::vector<Sample> out(peers_.size());
  std::lock_guard<std::mutex> lock(store_mu_);
  if (!store_) throw std::runtime_error("closed");
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (!store_->check({key_of(static_cast<int>(r))})) continue;  // never get() a missing key: it blocks
    auto bytes = store_->get(key_of(static_cast<int>(r)));
    std::string v(bytes.begin(), bytes.end());
    auto colon = v.find(':');
    if (colon == std::string::npos) continue;
    out[r] = Sample{true, std::stoull(v.substr(0, colon)), std::stoull(v.substr(colon + 1))};
  }
  return out;
}

std::string HealthMonitor::diagnose(uint64_t failing_seq, const std::string& op_name) {
  {
    std::lock_guard<std::mutex> lock(store_mu_);
    if (!store_) return "";  // closed: nothing to say
  }
  std::vector<Sample> first, second;
  auto wait = interval_ * 2 + interval_ / 5;
  try {
    first = sample();
    std::this_thread::sleep_for(wait);
    second = sample();
  } catch (const std::exception&) {
    return detail::cat("health check: the rendezvous store is unreachable, so ", store_owner_,
                       " has exited or its host is down; look at its error first.");
  }
  std::vector<int> dead, stalled;
  std::string lines;
  for (size_t i = 0; i < peers_.size(); ++i) {
    int r = static_cast<int>(i);
    if (r == rank_) continue;
    const PeerInfo& p = peers_[i];
    const Sample& a = first[i];
    const Sample& b = second[i];
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
  return detail::cat("health check on rank ", rank_, ":", lines,
                     dead.empty() ? "" : detail::cat("\n  dead: rank", dead.size() > 1 ? "s " : " ", format_ranks(dead)),
                     stalled.empty() ? ""
                                     : detail::cat("\n  stalled: rank", stalled.size() > 1 ? "s " : " ",
                                                   format_ranks(stalled)));
}

}  // namespace dtcore
