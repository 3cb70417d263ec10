// The roster: one entry per rank, registered in the rendezvous store.
//
// An entry says who a rank is (host, pid, local rank, device and its physical identity) and what it runs (the
// fingerprint: torch, dtcore, NCCL, CUDA, C++ ABI, backend, world size, job id). Rank 0
// compares fingerprints, which must agree on every rank, and reports the odd ranks by number
// and host. Thread safety: plain values and pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dtcore/bootstrap/world_spec.h"

namespace dtcore {

struct RosterEntry {
  int rank = -1;
  std::string host;
  long pid = 0;
  int local_rank = 0;
  std::string device;  // "cpu", "cuda:3"
  // What makes the device one piece of hardware (a GPU's UUID), "" for none of its own (CPU):
  // "cuda:0" of two processes with different CUDA_VISIBLE_DEVICES are two GPUs. See find_shared_devices.
  std::string device_id;
  std::map<std::string, std::string> fingerprint;  // must be equal across ranks

  // This process's entry: its rank, local rank and pid, and what the caller says of it.
  static RosterEntry for_process(const WorldSpec& spec, std::string host, std::string device,
                                 std::map<std::string, std::string> fingerprint, std::string device_id = "");

  std::string encode() const;
  static RosterEntry decode(const std::string& text);  // RendezvousError on a malformed entry
};

// "0-3,5,7-8" from {0,1,2,3,5,7,8}.
std::string format_ranks(std::vector<int> ranks);

// "" when every fingerprint field agrees across `roster`; otherwise a message that names, for
// each differing field, the values with the ranks and hosts that have them.
std::string compare_fingerprints(const std::vector<RosterEntry>& roster);

// "" when no two ranks on one host hold the same device (equal, non-empty device_id); else a
// message. Ranks without a device of their own (CPU, Gloo) share nothing, whatever their local
// ranks: two launcher "nodes" on one machine each count local ranks from 0.
std::string find_shared_devices(const std::vector<RosterEntry>& roster);

}  // namespace dtcore
