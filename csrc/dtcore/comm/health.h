// HealthMonitor: names the dead or stalled ranks when a collective fails.
//
// Each rank runs one thread that writes "health/<rank>" = "<beat>:<last collective started>"
// to the rendezvous store every `interval`, on a store connection of its own. When a collective
// fails or times out on a survivor, diagnose() samples every rank's entry twice, a little more
// than two intervals apart, and reports:
//   - ranks whose beat did not advance: the process exited, or its host is down;
//   - ranks that beat but have not started the failing collective: stalled (or on another path);
//   - the store itself unreachable: the rank that serves it (rank 0) exited.
// A live rank's thread keeps beating while its Python code holds the GIL or sits in a kernel,
// so "no heartbeat" means the process (or its host) is gone, not merely busy.
//
// Ownership: owns its thread and its store connection. Thread safety: record_progress() is
// lock-free and may be called from any thread; diagnose() may be called from several threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtcore/bootstrap/rendezvous.h"

namespace dtcore {

struct PeerInfo {
  std::string host;
  long pid = 0;
};

class HealthMonitor {
 public:
  // `peers[r]` describes rank r. `beat_store` and `sample_store` must be connections no one else
  // uses (they may be one object in tests); their request timeout is set to max(5 intervals, 5 s).
  HealthMonitor(c10::intrusive_ptr<c10d::Store> beat_store, c10::intrusive_ptr<c10d::Store> sample_store, int rank,
                std::vector<PeerInfo> peers, std::chrono::milliseconds interval, std::string store_owner);
  // A monitor for this rank of a completed rendezvous, on two new store connections, beating
  // every settings.heartbeat_interval_s.
  static std::shared_ptr<HealthMonitor> for_rendezvous(Rendezvous& rendezvous, const Settings& settings);
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // The sequence number of the last collective this rank started.
  void record_progress(uint64_t seq) { progress_.store(seq, std::memory_order_relaxed); }

  // Blocks for about 2.2 intervals (at most that plus max(5 intervals, 5 s) when the store does
  // not answer). Returns "" when every other rank is alive and has started collective
  // `failing_seq`, or when closed; otherwise one line per suspect rank, by rank, host and pid.
  std::string diagnose(uint64_t failing_seq, const std::string& op_name);

  std::chrono::milliseconds interval() const { return interval_; }

  // Stops the heartbeat thread and drops both connections. Idempotent and safe from several
  // threads; a diagnosis under way then reports nothing.
  void close();

 private:
  struct Sample {
    bool present = false;
    uint64_t beat = 0;
    uint64_t seq = 0;
  };
  static std::vector<Sample> sample(c10d::Store& store, size_t world);
  void beat_once();
  void loop();

  const int rank_;
  const std::vector<PeerInfo> peers_;
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds request_bound_;  // max(5 intervals, 5 s)
  const std::string store_owner_;                  // "rank 0 (host a)" or "the torchrun agent", for messages

  std::atomic<uint64_t> progress_{0};
  std::atomic<bool> closed_{false};
  uint64_t beats_ = 0;  // heartbeat thread only (and the constructor, before it starts)

  // Why two connections: a diagnosis waits on replies (check, get), which c10d's client does not
  // bound when the server is stopped; the heartbeat only sends (set), so it never waits behind one.
  std::mutex beat_mu_;  // guards beat_store_
  c10::intrusive_ptr<c10d::Store> beat_store_;
  std::mutex sample_mu_;  // guards sample_store_ (the pointer; samplers hold their own reference)
  c10::intrusive_ptr<c10d::Store> sample_store_;

  std::mutex close_mu_;  // one close() at a time
  std::mutex mu_;        // guards stop_
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dtcore
