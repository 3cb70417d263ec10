// Peer state: what a rank's heartbeat says, and the judgement of a job's ranks from it.
//
// The health monitor (health.h) publishes a Beat per rank and samples everyone's; this file is
// the pure part: encoding a Beat, reading a process's state on this host, and judging every peer
// (dead, stopped, busy elsewhere, waiting, failed, left) with the root cause of a wait. Kept free
// of threads and stores so that every case can be tested on made-up views.
// See Note [Heartbeat].
//
// Thread safety: pure functions, except process_state(), which reads /proc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtcore {

// Note [Heartbeat]
// Every rank writes "health/<rank>" = Beat::encode() every heartbeat interval, from a thread of
// its own that runs while Python holds the GIL or a kernel runs, so a beat that stops advancing
// means the process is gone, stopped (SIGSTOP, a debugger) or its host unreachable, never merely
// busy. The beat carries the rank's progress: the last collective it started and the last it
// finished, so a peer can tell a rank waiting in the same collective (a victim, never accused)
// from one that has not reached it (busy in its own code, or on another path). A rank whose
// collective failed says so ('f', with the number); one that shut down says so last ('x'), so
// that the ranks outliving it do not take an orderly exit for a death. Peers sample all the beats
// only while one of their collectives waits longer than an interval, or to diagnose a failure.
// The beat also carries the running signature of the last collective started, which each rank
// compares with its own at that number, reading its two neighbours' beats every interval (See
// Note [Collective signature]).
struct Beat {
  enum class State : char { kRunning = 'r', kFailed = 'f', kLeft = 'x' };

  uint64_t count = 0;     // advances every interval while the process runs
  uint64_t started = 0;   // the last collective issued here (0: none yet)
  uint64_t finished = 0;  // the last collective finished here, ok or not
  State state = State::kRunning;
  uint64_t failed = 0;     // the first collective that failed here (0: none)
  uint64_t signature = 0;  // the running signature at `started` (0: none)

  // "count:started:finished:state:failed:signature" (the signature in hexadecimal), e.g.
  // "41:17:16:r:0:9e3779b97f4a7c15".
  std::string encode() const;
  // nullopt for anything else (a foreign or older value).
  static std::optional<Beat> decode(std::string_view text);

  bool in_collective() const { return started > finished; }
};

// A process as this host sees it; see process_state().
enum class ProcessState {
  kUnknown,  // on another host: not visible from here
  kGone,     // no such process (or a zombie): it exited
  kStopped,  // state T or t: SIGSTOP, Ctrl-Z, a debugger
  kRunning,  // there, and running or sleeping
};

// The state of process `pid` on this host, from /proc/<pid>/stat (`proc_root` for tests).
ProcessState process_state(long pid, const std::string& proc_root = "/proc");

// What this rank knows of one rank from the samples it took.
struct PeerView {
  int rank = -1;  // the job rank it is named by; -1: its index in the views (the job's own monitor)
  std::string host;
  long pid = 0;
  bool seen = false;    // a beat was read
  Beat beat;            // the last one read
  double silent_s = 0;  // seconds since its count last advanced here (or since sampling began)
  ProcessState process = ProcessState::kUnknown;
};

// True when `v`'s silence is explained before it reaches `dead_after_s`: its process, on this host,
// is gone or stopped, and it has been silent for two thirds of that (so that a live process in
// another PID namespace under the same host name, which keeps beating, is never taken for gone).
bool confirmed_silent(const PeerView& v, double dead_after_s);

// The judgement of a wait or failure at collective `seq` (`op`: its name, e.g. "all_reduce").
struct Diagnosis {
  std::string lines;          // one "\n  - rank r (host h, pid p): ..." per rank worth naming
  std::vector<int> culprits;  // the root cause: the ranks the others wait for
  std::string culprit_kind;   // "dead", "stopped", ... of the culprits, for the summary line
  bool empty() const { return lines.empty(); }
  // "health check on rank 0:<lines>\n  root cause: rank 2 (stopped)", or "" when nothing was found.
  std::string text(int self) const;
};

// Judges every rank but `self` from `views` (indexed by rank in the monitored group; each named
// by its PeerView::rank where set). A rank is dead when its beat has not advanced for `dead_after_s`.
// The Diagnosis's culprits are the names.
Diagnosis judge(const std::vector<PeerView>& views, int self, uint64_t seq, std::string_view op, double dead_after_s);

}  // namespace dtcore
