#include "dtcore/common/knobs.h"

#include <cmath>
#include <stdexcept>

#include "dtcore/common/error.h"

namespace dtcore {

const std::vector<Knob>& knobs() {
  // One line each: name, default, doc. Keep docs/knobs.md in step (tests/py/test_knobs.py).
  static const std::vector<Knob> kKnobs = {
      {"DTCORE_RANK", "", "Global rank of this process; beats the launcher's variable."},
      {"DTCORE_WORLD_SIZE", "", "Number of processes in the job; beats the launcher's variable."},
      {"DTCORE_LOCAL_RANK", "", "Rank of this process on its node (selects the GPU)."},
      {"DTCORE_LOCAL_WORLD_SIZE", "", "Number of processes on this node."},
      {"DTCORE_NODE_RANK", "", "Index of this node in the job."},
      {"DTCORE_NUM_NODES", "", "Number of nodes in the job."},
      {"DTCORE_MASTER_ADDR", "", "Host of rank 0, where the rendezvous store listens."},
      {"DTCORE_MASTER_PORT", "", "Port of the rendezvous store on the master host."},
      {"DTCORE_BACKEND", "auto", "Communicator: auto (NCCL when CUDA is usable and built in, else Gloo), nccl or gloo."},
      {"DTCORE_TIMEOUT", "300", "Seconds that rendezvous and each collective may take before failing with the missing ranks."},
      {"DTCORE_RDZV_LOG_INTERVAL", "5", "Seconds between rendezvous progress lines that name the ranks still missing."},
      {"DTCORE_HEARTBEAT_INTERVAL", "1", "Seconds between health heartbeats; a failed collective names ranks silent for two intervals."},
      {"DTCORE_STORE_LIBUV", "auto", "TCPStore server backend: auto (libuv when this torch has it), 1 or 0."},
      {"DTCORE_LOG_LEVEL", "info", "Console level: debug, info, warn or error."},
      {"DTCORE_LOG_RANKS", "0", "Ranks whose info lines reach the console: a list such as 0,3 or 'all'; others print warnings and errors only."},
      {"DTCORE_LOG_DIR", "", "Directory for per-rank log files (dtcore-<time>-rank<r>.log); init(log_dir=) beats it."},
  };
  return kKnobs;
}

std::optional<std::string> knob_value(const Env& env, std::string_view name) {
  for (const Knob& k : knobs()) {
    if (name == k.name) {
      if (auto v = env.get(name)) {
        return v;
      }
      if (*k.default_value == '\0') {
        return std::nullopt;
      }
      return std::string(k.default_value);
    }
  }
  throw std::logic_error(std::string("dtcore bug: knob ") + std::string(name) +
                         " is read but not declared in csrc/dtcore/common/knobs.cpp");
}

std::optional<double> knob_seconds(const Env& env, std::string_view name) {
  auto v = knob_value(env, name);
  if (!v) {
    return std::nullopt;
  }
  double seconds = 0;
  size_t used = 0;
  try {
    seconds = std::stod(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DTCORE_CHECK(used == v->size() && std::isfinite(seconds) && seconds > 0, ConfigError, name, "='", *v,
               "' is not a positive number of seconds. Fix: set it to e.g. 300, or unset it for the default.");
  return seconds;
}

}  // namespace dtcore
