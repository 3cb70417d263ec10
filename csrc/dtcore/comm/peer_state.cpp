#include "dtcore/comm/peer_state.h"

#include <charconv>
#include <fstream>
#include <sstream>

#include "dtcore/bootstrap/roster.h"
#include "dtcore/common/error.h"

namespace dtcore {
namespace {

bool parse_u64(std::string_view text, uint64_t& out, int base = 10) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, base);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

std::string seconds_text(double s) {
  std::ostringstream out;
  out.precision(s < 10 ? 2 : 3);
  out << s;
  return out.str();
}

// Why a rank is named, from most to least likely to be what the others wait for.
enum Tier { kSilent, kLeftEarly, kBusy, kBehind, kFailed, kNone };

}  // namespace

std::string Beat::encode() const {
  char sig[17];
  auto [end, ec] = std::to_chars(sig, sig + sizeof sig, signature, 16);
  return detail::cat(count, ":", started, ":", finished, ":", static_cast<char>(state), ":", failed, ":",
                     std::string_view(sig, static_cast<size_t>(end - sig)));
}

std::optional<Beat> Beat::decode(std::string_view text) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  Beat b;
  if (parts.size() != 6 || parts[3].size() != 1) return std::nullopt;
  if (!parse_u64(parts[0], b.count) || !parse_u64(parts[1], b.started) || !parse_u64(parts[2], b.finished) ||
      !parse_u64(parts[4], b.failed) || !parse_u64(parts[5], b.signature, 16)) {
    return std::nullopt;
  }
  switch (parts[3][0]) {
    case 'r': b.state = State::kRunning; break;
    case 'f': b.state = State::kFailed; break;
    case 'x': b.state = State::kLeft; break;
    default: return std::nullopt;
  }
  return b;
}

ProcessState process_state(long pid, const std::string& proc_root) {
  if (pid <= 0) return ProcessState::kUnknown;
  std::ifstream in(proc_root + "/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return ProcessState::kGone;
  // "pid (comm) S ...": comm may hold spaces and parentheses, so the state follows the last ')'.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return ProcessState::kRunning;
  switch (stat[paren + 2]) {
    case 'Z':
    case 'X': return ProcessState::kGone;
    case 'T':
    case 't': return ProcessState::kStopped;
    default: return ProcessState::kRunning;
  }
}

bool confirmed_silent(const PeerView& v, double dead_after_s) {
  const bool down = v.process == ProcessState::kGone || v.process == ProcessState::kStopped;
  return down && v.silent_s >= dead_after_s * 2 / 3;
}

std::string Diagnosis::text(int self) const {
  if (lines.empty()) return "";
  std::string out = detail::cat("health check on rank ", self, ":", lines);
  if (!culprits.empty()) {
    out += detail::cat("\n  root cause: rank", culprits.size() > 1 ? "s " : " ", format_ranks(culprits), " (",
                       culprit_kind, ")");
  }
  return out;
}

Diagnosis judge(const std::vector<PeerView>& views, int self, uint64_t seq, std::string_view op, double dead_after_s) {
  Diagnosis d;
  std::vector<int> waiting;
  std::vector<std::vector<int>> by_tier(kNone);
  std::vector<std::string> kind_of(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const int r = static_cast<int>(i);
    if (r == self) continue;
    const PeerView& v = views[i];
    const Beat& b = v.beat;
    const int name = v.rank >= 0 ? v.rank : r;  // by its job rank
    const std::string who = detail::cat("\n  - rank ", name, " (host ", v.host, ", pid ", v.pid, "): ");
    Tier tier = kNone;
    std::string line;
    if (v.seen && b.state == Beat::State::kLeft) {
      if (b.failed != 0) {
        tier = kFailed;
        line = detail::cat("left the job after its collective #", b.failed, " failed there (its error is in its log)");
      } else if (b.started < seq) {
        tier = kLeftEarly;
        kind_of[i] = "left early";
        line = detail::cat("left the job (dtcore.shutdown() or a normal exit) after collective #", b.started,
                           ", without starting ", op, " #", seq, ": its loop ran fewer steps than this rank's");
      } else {
        line = detail::cat("left the job after starting ", op, " #", seq);
      }
    } else if (v.seen && b.state == Beat::State::kFailed) {
      // Failed first, whatever it did after (raised and exited, most often): a victim to name,
      // whose own error says more, not the rank the others wait for.
      tier = kFailed;
      const bool silent = v.silent_s >= dead_after_s || confirmed_silent(v, dead_after_s);
      line = detail::cat(silent ? "exited or stopped after its" : "alive; its", " collective #", b.failed,
                         " failed there (its error is in its log)");
    } else if (!v.seen || v.silent_s >= dead_after_s || confirmed_silent(v, dead_after_s)) {
      tier = kSilent;
      const std::string silence = v.seen ? detail::cat("no heartbeat for ", seconds_text(v.silent_s), " s")
                                         : detail::cat("never sent a heartbeat in ", seconds_text(v.silent_s), " s");
      switch (v.process) {
        case ProcessState::kGone:
          kind_of[i] = "dead";
          line = detail::cat(silence, "; the process has exited (no process ", v.pid, " on this host)");
          break;
        case ProcessState::kStopped:
          kind_of[i] = "stopped";
          line = detail::cat(silence, "; the process is stopped (state T: SIGSTOP, Ctrl-Z or a debugger). Fix: ",
                             "resume it (kill -CONT ", v.pid, ") or end it");
          break;
        case ProcessState::kRunning:
          kind_of[i] = "hung";
          line = detail::cat(silence,
                             " although its process is there: it is hung so hard that its heartbeat thread cannot "
                             "run (uninterruptible I/O, a swapping host)");
          break;
        case ProcessState::kUnknown:
          kind_of[i] = "dead, stopped or unreachable";
          line = detail::cat(silence, "; the process has exited or is stopped, or its host is unreachable");
          break;
      }
    } else if (b.started >= seq) {
      waiting.push_back(name);
    } else if (!b.in_collective()) {
      tier = kBusy;
      kind_of[i] = "stalled";
      line = detail::cat("alive, but has not started ", op, " #", seq, " (its last collective is #", b.started,
                         "): it is stalled in its own code (a long step, data loading, a checkpoint) or took "
                         "another path");
    } else {
      tier = kBehind;
      kind_of[i] = "behind";
      line = detail::cat("alive, still waiting in its own collective #", b.started, " (this rank finished it)");
    }
    if (!line.empty()) d.lines += who + line;
    if (tier != kNone) by_tier[tier].push_back(r);  // by index: kind_of's; named below
  }
  if (d.lines.empty()) return d;  // everyone waits in the same collective: nothing to say
  if (!waiting.empty()) {
    d.lines += detail::cat("\n  - rank", waiting.size() > 1 ? "s " : " ", format_ranks(waiting), ": waiting in ", op,
                           " #", seq, " like this rank");
  }
  for (int t = kSilent; t < kFailed; ++t) {
    if (by_tier[t].empty()) continue;
    d.culprit_kind = kind_of[static_cast<size_t>(by_tier[t].front())];
    for (int r : by_tier[t]) {
      if (kind_of[static_cast<size_t>(r)] != d.culprit_kind) d.culprit_kind = "dead or stopped";
      const PeerView& v = views[static_cast<size_t>(r)];
      d.culprits.push_back(v.rank >= 0 ? v.rank : r);
    }
    break;
  }
  return d;
}

}  // namespace dtcore
