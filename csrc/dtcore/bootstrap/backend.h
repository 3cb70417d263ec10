// The backend choice: which communicator a process uses, decided in one place.
//
// init() and the resource checker both call choose_backend(), so what the checker reports is what
// init() will do: "auto" is NCCL when torch can use a CUDA device here and dtcore was built with
// NCCL, else Gloo; "nccl" asked for where it cannot run is an error that says why (no GPU, a CPU
// build of torch, or a dtcore built without NCCL) and what to do. Thread safety: pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtcore/common/sourced.h"

namespace dtcore {

// Whether this dtcore was compiled with its NCCL communicator.
bool built_with_nccl();

struct BackendFacts {
  int cuda_devices = 0;              // devices torch can use here (0: none, or a CPU build)
  std::string torch_version;         // for messages
  std::string cuda_visible_devices;  // as set, "" when unset; for messages
};

// "nccl" or "gloo" for `requested` ("auto", "nccl" or "gloo", as read_settings() checked it).
// Throws ConfigError naming the request's source when it cannot be honoured, unless `problems`
// is given: then the problem is appended there and nullopt returned.
std::optional<std::string> choose_backend(const Sourced<std::string>& requested, const BackendFacts& facts,
                                          std::vector<Problem>* problems = nullptr);

}  // namespace dtcore
