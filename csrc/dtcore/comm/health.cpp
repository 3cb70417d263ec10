#include "dtcore/comm/health.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "dtcore/bootstrap/roster.h"
#include "dtcore/common/backoff.h"
#include "dtcore/common/c10_error.h"
#include "dtcore/common/error.h"
#include "dtcore/common/log.h"
#include "dtcore/common/units.h"

namespace dtcore {
namespace {

using Clock = std::chrono::steady_clock;

std::string key_of(size_t rank) { return "health/" + std::to_string(rank); }

// Set by the first rank that finds two ranks' signatures differ: "seq:rank:rank" (the two ranks).
const std::string kDivergedKey = "health/diverged";
// A rank's signature list (SignatureHistory::encode()), published when it is one of those two.
std::string signatures_key(int rank) { return "health/signatures/" + std::to_string(rank); }

std::string text_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// "all_reduce (torch.float32[8], sum)" from "all_reduce #12 (torch.float32[8], sum)".
std::string without_number(const std::string& what) {
  const size_t hash = what.find(" #");
  if (hash == std::string::npos) return what;
  const size_t end = what.find(' ', hash + 2);
  return what.substr(0, hash) + (end == std::string::npos ? "" : what.substr(end));
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A wait is worth a warning on the console after this long.
constexpr auto kWarnAfter = std::chrono::seconds(5);
// A warning whose judgement did not change is repeated this often.
constexpr auto kWarnEvery = std::chrono::seconds(30);
// After a diagnosis, the watch goes on this long, so that the next failure's is ready at once.
constexpr auto kKeepWatching = std::chrono::seconds(30);

}  // namespace

std::string divergence_message(uint64_t seq, bool exact, const std::string& calls, std::string_view consequence) {
  return detail::cat("the ranks called different collectives at #", seq,
                     exact ? ":" : " (or earlier; see the flight recorder):", calls, "\n", consequence,
                     " Fix: every rank must issue the same collectives in the same order, with the same sizes, dtypes, "
                     "reductions and roots; find where the ranks' code paths part (a condition on the rank, or uneven "
                     "data). `python -m dtcore.check --analyze LOG_DIR` lines the ranks' flight records up.");
}

HealthMonitor::HealthMonitor(c10::intrusive_ptr<c10d::Store> beat_store, c10::intrusive_ptr<c10d::Store> sample_store,
                             int rank, std::vector<PeerInfo> peers, std::chrono::milliseconds interval,
                             std::string store_owner, std::vector<int> ranks)
    : rank_(rank),
      peers_(std::move(peers)),
      ranks_(std::move(ranks)),
      interval_(interval),
      request_bound_(std::max(interval * 5, std::chrono::milliseconds(5000))),
      store_owner_(std::move(store_owner)),
      beat_store_(std::move(beat_store)),
      sample_store_(std::move(sample_store)) {
  beat_store_->setTimeout(request_bound_);
  sample_store_->setTimeout(request_bound_);
  beat_once();  // present before init() returns, so a later diagnosis finds this rank
  beat_thread_ = std::thread([this] { beat_loop(); });
  watch_thread_ = std::thread([this] { watch_loop(); });
}

std::shared_ptr<HealthMonitor> HealthMonitor::for_rendezvous(Rendezvous& rendezvous, const Settings& settings,
                                                             const std::vector<int>& ranks, const std::string& prefix) {
  const auto interval = seconds_to_timeout(settings.heartbeat_interval_s.value, settings.heartbeat_interval_s.source);
  const auto& roster = rendezvous.roster();
  std::vector<PeerInfo> peers;
  int rank = rendezvous.rank();
  if (ranks.empty()) {
    for (const auto& e : roster) peers.push_back(PeerInfo{e.host, e.pid});
  } else {  // a subgroup's: its members, this rank at its index among them
    const auto me = std::find(ranks.begin(), ranks.end(), rendezvous.rank());
    DTCORE_CHECK(me != ranks.end(), ConfigError, "rank ", rendezvous.rank(), " is not in the group of ranks ",
                 format_ranks(ranks), " it asked to watch. Fix: build a group's communicator on its members only.");
    rank = static_cast<int>(me - ranks.begin());
    for (int r : ranks) {
      DTCORE_CHECK(r >= 0 && static_cast<size_t>(r) < roster.size(), ConfigError, "a group names rank ", r,
                   ", but the job has ranks 0..", roster.size() - 1, ". Fix: build the group from the job's ranks.");
      peers.push_back(PeerInfo{roster[static_cast<size_t>(r)].host, roster[static_cast<size_t>(r)].pid});
    }
  }
  auto connect = [&] {
    c10::intrusive_ptr<c10d::Store> store = rendezvous.new_connection();
    if (prefix.empty()) return store;
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store)));
  };
  auto beat = connect();
  auto sample = connect();
  return std::make_shared<HealthMonitor>(std::move(beat), std::move(sample), rank, std::move(peers), interval,
                                         rendezvous.store_owner(), ranks);
}

HealthMonitor::~HealthMonitor() { close(); }

void HealthMonitor::close() {
  std::lock_guard<std::mutex> once(close_mu_);
  if (closed_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (beat_thread_.joinable()) beat_thread_.join();
  linger_for_readers();
  try {
    beat_once(Beat::State::kLeft);  // the others now know this rank left, and did not die
  } catch (const std::exception& e) {
    log::debug("health: the last heartbeat failed: ", error_text(e));
  }
  {
    std::lock_guard<std::mutex> lock(beat_mu_);
    beat_store_.reset();
  }
  {
    std::lock_guard<std::mutex> lock(sample_mu_);
    sample_store_.reset();
  }
  // The watch thread may sit in a store call for up to request_bound_; it holds its own
  // reference to the connection, and this object outlives it only if joined.
  if (watch_thread_.joinable()) watch_thread_.join();
}

void HealthMonitor::linger_for_readers() {
  // A mismatch ends the job: this rank raises and may exit, and on rank 0 the store goes with it
  // while a peer still reads this rank's call to name it. So a rank that gathered the ranks' calls
  // waits, bounded, until every peer has read them too (each acknowledges in gather_calls()).
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefix = gathered_prefix_;
  }
  c10::intrusive_ptr<c10d::Store> store;
  {
    std::lock_guard<std::mutex> lock(sample_mu_);
    store = sample_store_;
  }
  if (prefix.empty() || !store) return;
  std::vector<std::string> keys;
  for (size_t r = 0; r < peers_.size(); ++r) keys.push_back(prefix + "read/" + std::to_string(r));
  const auto deadline = Clock::now() + std::max(interval_ * 3, std::chrono::milliseconds(3000));
  Backoff backoff(std::chrono::milliseconds(5), std::chrono::milliseconds(100));
  try {
    while (!store->check(keys) && Clock::now() < deadline) backoff.pause();
  } catch (const std::exception& e) {
    log::debug("health: waiting for the others to read the ranks' calls failed: ", error_text(e));
  }
}

void HealthMonitor::record_started(uint64_t seq, const std::string& what, uint64_t signature) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_.empty()) waiting_since_ = Clock::now();
  in_flight_.emplace(seq, what);
  started_ = std::max(started_, seq);
  if (signature != 0) history_.add(seq, signature, without_number(what));
}

std::string HealthMonitor::divergence() {
  if (!diverged()) return "";
  std::lock_guard<std::mutex> lock(mu_);
  return divergence_;
}

void HealthMonitor::record_finished(uint64_t seq, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool was_oldest = !in_flight_.empty() && in_flight_.begin()->first == seq;
  in_flight_.erase(seq);
  if (was_oldest) waiting_since_ = Clock::now();  // the next one has waited only since now
  if (!ok && failed_ == 0) {
    failed_ = seq;
    beat_soon_ = true;  // the peers learn at once that this rank failed (and did not die)
    cv_.notify_all();
  }
}

Beat HealthMonitor::beat_now(Beat::State state) {
  std::lock_guard<std::mutex> lock(mu_);
  Beat b;
  b.started = started_;
  // The last collective finished with all before it: what a peer compares with its own.
  b.finished = in_flight_.empty() ? started_ : in_flight_.begin()->first - 1;
  b.failed = failed_;
  b.state = state != Beat::State::kRunning ? state : failed_ != 0 ? Beat::State::kFailed : Beat::State::kRunning;
  b.signature = history_.signature_at(started_).value_or(0);
  return b;
}

void HealthMonitor::beat_once(Beat::State state) {
  Beat b = beat_now(state);
  std::lock_guard<std::mutex> lock(beat_mu_);
  if (!beat_store_) return;  // closed
  b.count = ++beats_;
  std::string value = b.encode();
  beat_store_->set(key_of(static_cast<size_t>(rank_)), std::vector<uint8_t>(value.begin(), value.end()));
}

void HealthMonitor::beat_loop() {
  bool failing = false;  // log a run of failures once, not every interval
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (cv_.wait_for(lock, interval_, [this] { return stop_ || beat_soon_; }) && stop_) break;
    beat_soon_ = false;
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

bool HealthMonitor::should_watch_locked(Clock::time_point now) const {
  return wanted_ > 0 || now < watch_until_ || (!in_flight_.empty() && now - waiting_since_ >= interval_);
}

void HealthMonitor::watch_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto now = Clock::now();
    c10::intrusive_ptr<c10d::Store> store;
    {
      std::lock_guard<std::mutex> guard(sample_mu_);
      store = sample_store_;
    }
    if (!should_watch_locked(now)) {
      watch_ = Watch{};  // a new watch starts afresh: silence is measured from its first sample
      cv_.wait_for(lock, interval_, [this] { return stop_ || wanted_ > 0; });
      if (stop_ || !store || started_ == 0 || diverged()) continue;
      lock.unlock();
      // Between watches, the two neighbours' beats: every pair of adjacent ranks is compared by
      // whichever of the two is ahead, so a difference anywhere shows. See Note [Collective signature].
      const int world = static_cast<int>(peers_.size());
      const std::vector<int> neighbours{(rank_ + 1) % world, (rank_ + world - 1) % world};
      try {
        check_signatures(*store, sample(*store, neighbours));
      } catch (const std::exception& e) {
        log::debug("health: reading the neighbours' heartbeats failed (will retry): ", error_text(e));
      }
      lock.lock();
      continue;
    }
    lock.unlock();
    if (store) {
      sample_once(store);
      std::vector<std::optional<Beat>> beats;
      {
        std::lock_guard<std::mutex> guard(mu_);
        for (const PeerView& v : watch_.views) beats.push_back(v.seen ? std::optional<Beat>(v.beat) : std::nullopt);
      }
      if (!diverged()) check_signatures(*store, beats);
    }
    warn_if_waiting();
    lock.lock();
    cv_.notify_all();  // diagnoses waiting for a sample
    // While a diagnosis waits, samples come four times as often: its answer waits on them.
    sample_now_ = false;
    cv_.wait_for(lock, wanted_ > 0 ? interval_ / 4 : interval_, [this] { return stop_ || sample_now_; });
  }
}

std::vector<std::optional<Beat>> HealthMonitor::sample(c10d::Store& store, const std::vector<int>& ranks) const {
  std::vector<int> which = ranks;
  if (which.empty()) {
    for (size_t r = 0; r < peers_.size(); ++r) which.push_back(static_cast<int>(r));
  }
  std::vector<std::string> keys;
  for (int r : which) keys.push_back(key_of(static_cast<size_t>(r)));
  std::vector<std::vector<uint8_t>> values(keys.size());
  if (store.check(keys)) {
    values = store.multiGet(keys);  // one round trip: the common case
  } else {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (store.check({keys[i]})) values[i] = store.get(keys[i]);  // never get() a missing key: it blocks
    }
  }
  std::vector<std::optional<Beat>> out(peers_.size());
  for (size_t i = 0; i < keys.size(); ++i) out[static_cast<size_t>(which[i])] = Beat::decode(text_of(values[i]));
  return out;
}

void HealthMonitor::check_signatures(c10d::Store& store, const std::vector<std::optional<Beat>>& beats) {
  std::string found;
  try {
    if (store.check({kDivergedKey})) found = text_of(store.get(kDivergedKey));  // another rank found one
    if (found.empty()) {
      std::string mine;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t r = 0; r < beats.size() && found.empty(); ++r) {
          const auto& b = beats[r];
          if (static_cast<int>(r) == rank_ || !b || b->signature == 0) continue;
          // Compared where this rank still knows its own signature: the peer at or behind it.
          std::optional<uint64_t> own = history_.signature_at(b->started);
          if (!own || *own == b->signature) continue;
          found = detail::cat(b->started, ":", std::min<size_t>(r, rank_), ":", std::max<size_t>(r, rank_));
          mine = history_.encode(b->started);
        }
      }
      if (found.empty()) return;
      store.set(signatures_key(rank_), bytes_of(mine));  // before the announcement, so it is there when read
      store.set(kDivergedKey, bytes_of(found));
    }
  } catch (const std::exception& e) {
    log::debug("health: comparing the collective signatures failed (will retry): ", error_text(e));
    return;
  }
  settle_divergence(store, found);
}

void HealthMonitor::settle_divergence(c10d::Store& store, const std::string& found) {
  uint64_t seq = 0;
  int a = -1, b = -1;
  const int world = static_cast<int>(peers_.size());
  if (std::sscanf(found.c_str(), "%" SCNu64 ":%d:%d", &seq, &a, &b) != 3 || a < 0 || b < 0 || a >= world ||
      b >= world) {
    log::debug("health: a malformed divergence record '", found, "' in the store; ignored");
    return;
  }
  // The two ranks publish their signature lists; every rank reads both and finds the same first
  // difference, then each publishes its call there (gather_calls()).
  FirstDifference first{seq, false};
  try {
    if (rank_ == a || rank_ == b) {
      std::string mine;
      {
        std::lock_guard<std::mutex> lock(mu_);
        mine = history_.encode(seq);
      }
      store.set(signatures_key(rank_), bytes_of(mine));
    }
    const std::vector<std::string> keys{signatures_key(a), signatures_key(b)};
    const auto deadline = Clock::now() + std::max(interval_ * 3, std::chrono::milliseconds(3000));
    Backoff backoff(std::chrono::milliseconds(5), std::chrono::milliseconds(200));
    while (!store.check(keys) && Clock::now() < deadline) backoff.pause();
    if (store.check(keys)) {
      auto lists = store.multiGet(keys);
      auto la = SignatureList::decode(text_of(lists[0])), lb = SignatureList::decode(text_of(lists[1]));
      if (la && lb) first = first_difference(*la, *lb).value_or(first);
    }
  } catch (const std::exception& e) {
    log::debug("health: reading the signature lists of ranks ", named(a), " and ", named(b),
               " failed: ", error_text(e));
  }
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine = history_.call_at(first.seq).value_or("(no longer in this rank's history)");
  }
  std::string calls = gather_calls(first.seq, mine);
  if (calls.empty())
    calls = detail::cat("\n  - rank ", named(rank_), ": ", mine, " (the others' calls could not be read)");
  std::string text = divergence_message(
      first.seq, first.exact, calls,
      detail::cat("Found by comparing the ranks' heartbeats, after it ran (found by ranks ", named(a), " and ",
                  named(b), " at #", seq,
                  "): on a backend that does not check each call before it runs, it may have exchanged "
                  "data of another size, dtype or reduction, so its results and those since are wrong; every "
                  "collective from now on fails."));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!divergence_.empty()) return;
    divergence_ = text;
    diverged_flag_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  log::error(text);
}

void HealthMonitor::sample_once(const c10::intrusive_ptr<c10d::Store>& store) {
  std::vector<std::optional<Beat>> beats;
  std::string error;
  try {
    beats = sample(*store);
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  Watch& w = watch_;
  if (!w.active) {  // watch_loop() reset it when the last watch ended
    w.active = true;
    w.began = now;
    w.views.resize(peers_.size());
    w.advanced.assign(peers_.size(), now);
    for (size_t r = 0; r < peers_.size(); ++r) {
      w.views[r].host = peers_[r].host;
      w.views[r].pid = peers_[r].pid;
    }
  }
  w.sampled = now;
  w.store_error = error;
  if (!error.empty()) return;  // the views stay as last seen
  w.answered = now;
  for (size_t r = 0; r < beats.size(); ++r) {
    PeerView& v = w.views[r];
    if (beats[r] && (!v.seen || beats[r]->count != v.beat.count)) w.advanced[r] = now;
    if (beats[r]) {
      v.seen = true;
      v.beat = *beats[r];
    }
    v.silent_s = seconds(now - w.advanced[r]);
  }
}

std::vector<PeerView> HealthMonitor::views_locked() const {
  std::vector<PeerView> views = watch_.views;
  const std::string& here = peers_[static_cast<size_t>(rank_)].host;
  for (size_t r = 0; r < views.size(); ++r) {
    PeerView& v = views[r];
    v.rank = named(static_cast<int>(r));
    v.process = v.host == here ? process_state(v.pid) : ProcessState::kUnknown;
  }
  return views;
}

bool HealthMonitor::confirmed_locked() const {
  const double dead = seconds(dead_after());
  for (const PeerView& v : views_locked()) {
    if (v.seen && v.beat.state != Beat::State::kLeft && confirmed_silent(v, dead)) return true;
  }
  return false;
}

std::string HealthMonitor::judge_locked(uint64_t seq, const std::string& op_name) {
  std::vector<PeerView> views = views_locked();
  std::string text = judge(views, rank_, seq, op_name, seconds(dead_after())).text(named(rank_));
  if (watch_.store_error.empty()) return text;
  std::string last;
  if (!text.empty() && watch_.answered != Clock::time_point{}) {
    last = detail::cat("\n  What this rank saw last, ", static_cast<int>(seconds(Clock::now() - watch_.answered)),
                       " s before: ", text);
  }
  return detail::cat("health check: the rendezvous store is unreachable (", watch_.store_error, "), so ", store_owner_,
                     " has exited or its host is down; look at its error first.", last);
}

std::string HealthMonitor::gather_calls(uint64_t seq, const std::string& mine) {
  c10::intrusive_ptr<c10d::Store> store;
  {
    std::lock_guard<std::mutex> lock(sample_mu_);
    store = sample_store_;
  }
  if (!store || closed_) return "";
  const size_t world = peers_.size();
  const std::string prefix = detail::cat("calls/", seq, "/");
  std::map<std::string, std::vector<int>> by_call;
  try {
    store->set(prefix + std::to_string(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    // Every rank publishes at the same collective; a rank that died meanwhile is named as unknown.
    // Polled as sample() reads beats: one check of every key, then one multiGet.
    std::vector<std::string> keys;
    for (size_t r = 0; r < world; ++r) keys.push_back(prefix + std::to_string(r));
    const auto deadline = Clock::now() + std::max(interval_ * 3, std::chrono::milliseconds(3000));
    Backoff backoff(std::chrono::milliseconds(5), std::chrono::milliseconds(200));
    while (!store->check(keys) && Clock::now() < deadline) backoff.pause();
    std::vector<std::vector<uint8_t>> values(world);
    if (store->check(keys)) {
      values = store->multiGet(keys);
    } else {
      for (size_t r = 0; r < world; ++r) {
        if (store->check({keys[r]})) values[r] = store->get(keys[r]);  // never get() a missing key: it blocks
      }
    }
    for (size_t r = 0; r < world; ++r) {
      const std::string call = values[r].empty() ? "(its call could not be read: it did not reach this collective)"
                                                 : std::string(values[r].begin(), values[r].end());
      by_call[call].push_back(named(static_cast<int>(r)));
    }
  } catch (const std::exception& e) {
    log::debug("health: reading the ranks' calls at #", seq, " failed: ", error_text(e));
    return "";
  }
  try {
    store->set(prefix + "read/" + std::to_string(rank_), std::vector<uint8_t>{1});  // see close()
  } catch (const std::exception& e) {
    log::debug("health: acknowledging the ranks' calls at #", seq, " failed: ", error_text(e));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    gathered_prefix_ = prefix;
  }
  std::string out;
  for (const auto& [call, ranks] : by_call) {
    out += detail::cat("\n  - rank", ranks.size() > 1 ? "s " : " ", format_ranks(ranks), ": ", call);
  }
  return out;
}

std::string HealthMonitor::diagnose(uint64_t failing_seq, const std::string& op_name) {
  if (closed_) return "";
  if (diverged()) return divergence();  // the cause of any failure since
  std::unique_lock<std::mutex> lock(mu_);
  const auto asked = Clock::now();
  ++wanted_;
  watch_until_ = std::max(watch_until_, asked + kKeepWatching);
  sample_now_ = true;
  cv_.notify_all();
  // Ready when the watch has spanned dead_after() and sampled since the question: at once when
  // it has been watching this wait already.
  const auto bound = dead_after() + interval_ + request_bound_ * 2;
  // Sooner when a silent peer on this host is seen to be gone or stopped (confirmed_silent()).
  const bool ready = cv_.wait_until(lock, asked + bound, [&] {
    if (stop_) return true;
    if (!watch_.active || watch_.sampled < asked) return false;
    return watch_.sampled - watch_.began >= dead_after() || !watch_.store_error.empty() || confirmed_locked();
  });
  --wanted_;
  if (stop_ || closed_) return "";  // shut down meanwhile: not a finding
  // A peer that found the ranks' collectives differ raises and leaves: the watch's samples have
  // settled that finding by now (check_signatures()), and it, not the peer's exit, is the cause.
  if (diverged()) return divergence_;
  if (!ready) {
    return detail::cat("health check: the rendezvous store did not answer within ", seconds(bound), " s, so ",
                       store_owner_, " is stopped or its host is unreachable; look at it first.");
  }
  return judge_locked(failing_seq, op_name);
}

void HealthMonitor::warn_if_waiting() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto now = Clock::now();
  if (in_flight_.empty() || now - waiting_since_ < kWarnAfter || !watch_.active ||
      watch_.sampled - watch_.began < dead_after()) {
    return;
  }
  const auto& [seq, what] = *in_flight_.begin();
  const std::string op = what.substr(0, what.find(' '));
  std::string text = judge_locked(seq, op);
  // Repeated when the judgement changes (by its culprits' line), or every kWarnEvery.
  const std::string gist = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n'));
  if (gist == warned_ && now - warned_at_ < kWarnEvery) return;
  warned_ = gist;
  warned_at_ = now;
  const double waited = seconds(now - waiting_since_);
  lock.unlock();
  if (text.empty()) {
    log::warn("rank ", named(rank_), " has waited ", static_cast<int>(waited), " s in ", what,
              "; every other rank is alive and waits in it too: the collective itself is slow (large, or a slow "
              "link).");
  } else {
    log::warn("rank ", named(rank_), " has waited ", static_cast<int>(waited), " s in ", what, ". ", text);
  }
}

}  // namespace dtcore
