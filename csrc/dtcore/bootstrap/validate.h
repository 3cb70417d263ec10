// Validation of a WorldSpec, before any CUDA call and before any socket is opened.
//
// check_world() returns every problem found (so that the resource checker can report them item
// by item); validate_world() throws one ConfigError that lists them all. Each problem names the
// variable, its value and the fix (common/sourced.h). Thread safety: pure, except for the DNS lookup of the master.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/common/sourced.h"

namespace dtcore {

struct WorldCheckOptions {
  std::string backend = "gloo";  // the resolved backend: "nccl" or "gloo"
  int visible_gpus = -1;         // CUDA devices this process sees; -1 when not known (0: no GPU,
                                 // which choose_backend() reports, not the device check)
  bool resolve_master = true;    // look up master_addr (skipped by tests that need no DNS)
  std::string host;              // this host's name, for messages
};

std::vector<Problem> check_world(const WorldSpec& spec, const WorldCheckOptions& options);

// Throws ConfigError listing every problem; returns when there is none.
void validate_world(const WorldSpec& spec, const WorldCheckOptions& options);

// The CUDA device this process uses: its local rank, or 0 when the launcher bound exactly one
// GPU to each process (CUDA_VISIBLE_DEVICES names one device, as srun --gpus-per-task=1 does).
int cuda_device_index(const WorldSpec& spec, int visible_gpus);

// nullopt when `host` resolves to an address, else the resolver's message.
std::optional<std::string> resolve_error(const std::string& host);

}  // namespace dtcore
