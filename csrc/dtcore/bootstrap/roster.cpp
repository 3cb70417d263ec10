#include "dtcore/bootstrap/roster.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include "dtcore/common/error.h"

namespace dtcore {

RosterEntry RosterEntry::for_process(const WorldSpec& spec, std::string host, std::string device,
                                     std::map<std::string, std::string> fingerprint, std::string device_id) {
  RosterEntry e;
  e.rank = spec.rank.value;
  e.host = std::move(host);
  e.pid = static_cast<long>(getpid());
  e.local_rank = spec.local_rank.value;
  e.device = std::move(device);
  e.device_id = std::move(device_id);
  e.fingerprint = std::move(fingerprint);
  return e;
}

std::string RosterEntry::encode() const {
  std::ostringstream os;
  os << "rank=" << rank << "\nhost=" << host << "\npid=" << pid << "\nlocal_rank=" << local_rank
     << "\ndevice=" << device << "\ndevice_id=" << device_id << "\n";
  for (const auto& [k, v] : fingerprint) os << "fp." << k << "=" << v << "\n";
  return os.str();
}

namespace {

// The whole of `text` as an integer, or std::invalid_argument: "3x" is not rank 3.
template <typename Int>
Int whole_number(const std::string& text) {
  Int value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) throw std::invalid_argument(text);
  return value;
}

}  // namespace

RosterEntry RosterEntry::decode(const std::string& text) {
  RosterEntry e;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    try {
      if (key == "rank")
        e.rank = whole_number<int>(value);
      else if (key == "host")
        e.host = value;
      else if (key == "pid")
        e.pid = whole_number<long>(value);
      else if (key == "local_rank")
        e.local_rank = whole_number<int>(value);
      else if (key == "device")
        e.device = value;
      else if (key == "device_id")
        e.device_id = value;
      else if (key.starts_with("fp."))
        e.fingerprint[key.substr(3)] = value;
    } catch (const std::exception&) {
      DTCORE_CHECK(false, RendezvousError, "malformed roster entry in the rendezvous store (", key, "='", value,
                   "'): another program may be using the same MASTER_ADDR:MASTER_PORT. Fix: choose another "
                   "MASTER_PORT for this job.");
    }
  }
  DTCORE_CHECK(e.rank >= 0, RendezvousError,
               "malformed roster entry in the rendezvous store (no rank): another "
               "program may be using the same MASTER_ADDR:MASTER_PORT. Fix: choose another MASTER_PORT for this job.");
  return e;
}

std::string format_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

namespace {
std::string hosts_of(const std::vector<RosterEntry>& roster, const std::vector<int>& ranks) {
  std::set<std::string> hosts;
  for (const auto& e : roster) {
    if (std::find(ranks.begin(), ranks.end(), e.rank) != ranks.end()) hosts.insert(e.host);
  }
  std::string out;
  for (const auto& h : hosts) {
    if (!out.empty()) out += ", ";
    out += h;
  }
  return out;
}
}  // namespace

std::string compare_fingerprints(const std::vector<RosterEntry>& roster) {
  std::set<std::string> fields;
  for (const auto& e : roster) {
    for (const auto& kv : e.fingerprint) fields.insert(kv.first);
  }
  std::string out;
  for (const auto& field : fields) {
    std::map<std::string, std::vector<int>> by_value;
    for (const auto& e : roster) {
      auto it = e.fingerprint.find(field);
      by_value[it == e.fingerprint.end() ? std::string("<none>") : it->second].push_back(e.rank);
    }
    if (by_value.size() <= 1) continue;
    out += "\n  - " + field + " differs:";
    for (const auto& [value, ranks] : by_value) {
      out += detail::cat(" '", value, "' on rank", ranks.size() > 1 ? "s " : " ", format_ranks(ranks), " (host ",
                         hosts_of(roster, ranks), ");");
    }
  }
  if (out.empty()) return out;
  return "ranks disagree on what they run:" + out +
         "\nFix: every rank must run the same torch, dtcore, NCCL and CUDA builds and the same job settings; "
         "install the same versions on every host (and rebuild dtcore there with "
         "`pip install --no-build-isolation .`).";
}

std::string find_shared_devices(const std::vector<RosterEntry>& roster) {
  std::map<std::pair<std::string, std::string>, std::vector<const RosterEntry*>> by_device;
  for (const auto& e : roster) {
    if (!e.device_id.empty()) by_device[{e.host, e.device_id}].push_back(&e);
  }
  std::string out;
  for (const auto& [device, holders] : by_device) {
    if (holders.size() < 2) continue;
    std::vector<int> ranks;
    std::string seen_as;
    for (const RosterEntry* e : holders) {
      ranks.push_back(e->rank);
      seen_as +=
          detail::cat(seen_as.empty() ? "" : ", ", "rank ", e->rank, ": ", e->device, " at local rank ", e->local_rank);
    }
    out += detail::cat("\n  - ranks ", format_ranks(ranks), " on host ", device.first, " would share device ",
                       device.second, " (", seen_as, ")");
  }
  if (out.empty()) return out;
  return "several ranks on one host would share one device:" + out +
         "\nFix: give each process on a node a distinct LOCAL_RANK (the launcher does this when it starts them), "
         "and if CUDA_VISIBLE_DEVICES is set per process, a distinct device in it. (NCCL 2.30 and newer run "
         "several ranks on one GPU when every rank sets NCCL_MULTI_RANK_GPU_ENABLE=1.)";
}

}  // namespace dtcore
