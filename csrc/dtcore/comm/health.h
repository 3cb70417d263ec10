// HealthMonitor: names the dead, stopped or stalled ranks, while a collective waits and when it fails.
//
// Each rank runs two threads. The beat thread writes "health/<rank>" = Beat (peer_state.h) to the
// rendezvous store every `interval`, on a store connection of its own. The watch thread samples
// every rank's beat, on a second connection, whenever a collective of this rank has waited longer
// than an interval or a failure is being diagnosed; from the samples it knows how long each peer
// has been silent, and judge() (peer_state.h) tells dead from stopped, busy elsewhere, waiting in
// the same collective (never accused) or failed, and names the root cause. A wait longer than
// a few seconds is logged at warning level on this rank's console with that judgement; a
// collective's failure asks diagnose(), which answers from the samples the watch thread already
// has (at once after a timeout, within about two intervals after a sudden failure), so that every
// bucket failing in one backward shares one diagnosis. See Note [Heartbeat].
//
// The watch thread also compares the ranks' collective signatures, always, every interval: the
// beat carries this rank's latest one, and the two neighbours' beats are read and compared with
// this rank's history. A difference is settled on every rank (the first collective at which the
// ranks differ, and each rank's call there) and from then on divergence() says so: the
// communicator raises it at the next collective, and a diagnosis names it. See Note [Collective
// signature].
//
// Ownership: owns its threads and its two store connections. Thread safety: record_started() and
// record_finished() may be called from any thread; diagnose() from several at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtcore/bootstrap/rendezvous.h"
#include "dtcore/comm/peer_state.h"
#include "dtcore/comm/signature_history.h"

namespace dtcore {

// The message for ranks that called different collectives, first at `seq` (`exact` false: at
// `seq` or earlier): `calls` are gather_calls()'s lines, `consequence` what became of the data.
std::string divergence_message(uint64_t seq, bool exact, const std::string& calls, std::string_view consequence);

struct PeerInfo {
  std::string host;
  long pid = 0;
};

class HealthMonitor {
 public:
  // `peers[r]` describes rank r. `beat_store` and `sample_store` must be connections no one else
  // uses (they may be one object in tests); their request timeout is set to max(5 intervals, 5 s).
  // `ranks`: a subgroup's monitor watches the group's members only, rank r being the job's rank
  // ranks[r], by which every message names it; empty for the job's. See Note [Subgroup communicators].
  HealthMonitor(c10::intrusive_ptr<c10d::Store> beat_store, c10::intrusive_ptr<c10d::Store> sample_store, int rank,
                std::vector<PeerInfo> peers, std::chrono::milliseconds interval, std::string store_owner,
                std::vector<int> ranks = {});
  // A monitor for this rank of a completed rendezvous, on two new store connections, beating
  // every settings.heartbeat_interval_s. With `ranks` (a group's job ranks, in group order) it
  // watches that group, its beats under `prefix` on the store; ConfigError when this rank is not
  // among them.
  static std::shared_ptr<HealthMonitor> for_rendezvous(Rendezvous& rendezvous, const Settings& settings,
                                                       const std::vector<int>& ranks = {},
                                                       const std::string& prefix = "");
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // This rank started collective `seq` (`what`: "all_reduce #12 (torch.float32[8], sum)"), whose
  // running signature is `signature` (0: none, not compared). See Note [Collective signature].
  void record_started(uint64_t seq, const std::string& what, uint64_t signature = 0);
  // Collective `seq` finished here, successfully or not.
  void record_finished(uint64_t seq, bool ok);

  // Every rank's call at collective `seq`, when their signatures differ: this rank publishes
  // `mine` and reads the others' (each rank does the same at the same collective), for at most
  // a few seconds. "\n  - ranks 0,2-3: <call>\n  - rank 1: <call>", or "" when nothing was read.
  std::string gather_calls(uint64_t seq, const std::string& mine);

  // The judgement of collective `seq` (named `op_name`, e.g. "all_reduce") failing or timing out
  // on this rank: "" when every other rank is alive and waits in it too, or when closed; else one
  // line per rank worth naming, by rank, host and pid, and the root cause. Answers from the watch
  // thread's samples; blocks only until they span dead_after() (about two intervals after a
  // sudden failure), at most that plus two store timeouts when the store does not answer.
  std::string diagnose(uint64_t failing_seq, const std::string& op_name);

  // Whether the ranks were found to have called different collectives; never blocks.
  bool diverged() const { return diverged_flag_.load(std::memory_order_acquire); }
  // The message naming the first collective at which they differ and each rank's call there;
  // "" while none was found.
  std::string divergence();

  // A beat that has not advanced for this long means the process is dead or stopped.
  std::chrono::milliseconds dead_after() const { return interval_ * 2 + interval_ / 5; }
  std::chrono::milliseconds interval() const { return interval_; }

  // Writes a last beat saying this rank left (so that the others do not take it for dead), stops
  // both threads and drops both connections. Idempotent and safe from several threads; a
  // diagnosis under way then reports nothing.
  void close();

 private:
  // The samples of one watch, indexed by rank. Guarded by mu_.
  struct Watch {
    bool active = false;
    std::chrono::steady_clock::time_point began, sampled, answered;  // answered: the last sample that worked
    std::vector<PeerView> views;
    std::vector<std::chrono::steady_clock::time_point> advanced;  // when each count last changed
    std::string store_error;                                      // the last sample failed: the store is unreachable
  };

  // The beats of `ranks` (every rank when empty), by rank; nullopt for one not (yet) there.
  std::vector<std::optional<Beat>> sample(c10d::Store& store, const std::vector<int>& ranks = {}) const;
  Beat beat_now(Beat::State state);
  void beat_once(Beat::State state = Beat::State::kRunning);
  void beat_loop();
  void watch_loop();
  // Whether the watch thread should sample now; mu_ held.
  bool should_watch_locked(std::chrono::steady_clock::time_point now) const;
  // One sample into watch_; takes mu_ itself.
  void sample_once(const c10::intrusive_ptr<c10d::Store>& store);
  // The watch's views with each peer's process state where it runs on this host; mu_ held.
  std::vector<PeerView> views_locked() const;
  // A silent peer on this host is gone or stopped already (confirmed_silent()); mu_ held.
  bool confirmed_locked() const;
  // The judgement of the current watch at `seq`; mu_ held.
  std::string judge_locked(uint64_t seq, const std::string& op_name);
  // Compares this rank's signatures with the peers' in `beats` (by rank), and looks for a
  // difference another rank found; settles one found either way. Takes mu_ itself; store errors
  // are logged at debug level (the next interval tries again).
  void check_signatures(c10d::Store& store, const std::vector<std::optional<Beat>>& beats);
  // Every rank's part of settling a difference that `found` ("seq:rank:rank") announced.
  void settle_divergence(c10d::Store& store, const std::string& found);
  // close(): after gather_calls(), waits (bounded) until every peer has read the calls too.
  void linger_for_readers();
  // Logs a warning about the collective this rank waits in, when it has waited long enough and
  // the judgement changed or 30 s passed since the last one.
  void warn_if_waiting();

  // The job rank of peer `r`, by which messages name it.
  int named(int r) const { return ranks_.empty() ? r : ranks_[static_cast<size_t>(r)]; }

  const int rank_;  // this rank's index in peers_
  const std::vector<PeerInfo> peers_;
  const std::vector<int> ranks_;  // the peers' job ranks; empty: the job's own monitor (index = job rank)
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds request_bound_;  // max(5 intervals, 5 s)
  const std::string store_owner_;                  // "rank 0 (host a)" or "the torchrun agent", for messages

  std::atomic<bool> closed_{false};
  std::atomic<bool> diverged_flag_{false};  // divergence_ is set: read on every collective, without mu_

  // Why two connections: a diagnosis waits on replies (check, get), which c10d's client does not
  // bound when the server is stopped; the heartbeat only sends (set), so it never waits behind one.
  std::mutex beat_mu_;  // guards beat_store_ and beats_
  c10::intrusive_ptr<c10d::Store> beat_store_;
  uint64_t beats_ = 0;
  std::mutex sample_mu_;  // guards sample_store_ (the pointer; samplers hold their own reference)
  c10::intrusive_ptr<c10d::Store> sample_store_;

  std::mutex close_mu_;  // one close() at a time
  std::mutex mu_;        // guards everything below
  std::condition_variable cv_;
  bool stop_ = false;
  bool beat_soon_ = false;  // a failure to publish before the next interval
  // Progress: the collectives started and not finished, with their names; the first failure.
  uint64_t started_ = 0, failed_ = 0;
  std::map<uint64_t, std::string> in_flight_;
  SignatureHistory history_;     // this rank's last collectives' signatures and calls
  std::string divergence_;       // set once: see divergence()
  std::string gathered_prefix_;  // the last gather_calls()'s keys: close() lets the others read them
  std::chrono::steady_clock::time_point waiting_since_;  // when the oldest in-flight one started
  // Diagnosis: how many wait for a sample, and until when to keep watching after one.
  int wanted_ = 0;
  bool sample_now_ = false;  // a diagnosis asked: sample without waiting out the interval
  std::chrono::steady_clock::time_point watch_until_;
  Watch watch_;
  std::string warned_;  // the culprits of the last warning
  std::chrono::steady_clock::time_point warned_at_;
  std::thread beat_thread_, watch_thread_;
};

}  // namespace dtcore
