// Settings: how dtcore behaves in this process, read once, each value with its source.
//
// Precedence per value: an init() argument, then its DTCORE_* variable (common/knobs.h), then the
// knob's default. read_settings() is the only reader of these knobs: init() calls it once, and the
// resource checker calls it on the environment it judges, so the two can never disagree on a
// value. The job's shape (rank, world size, ...) is not here: read_world() reads it
// (bootstrap/launcher.h). Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dtcore/common/env.h"
#include "dtcore/common/log.h"
#include "dtcore/common/sourced.h"

namespace dtcore {

// DTCORE_LOG_RANKS: the ranks whose info lines reach the console.
struct LogRanks {
  bool all = false;
  std::vector<int> ranks;  // when !all

  bool includes(int rank) const;
  std::string to_string() const;  // "all" or "0,3"
};

struct Settings {
  Sourced<double> timeout_s;      // rendezvous and each collective
  Sourced<std::string> backend;   // as asked: "auto", "nccl" or "gloo"; see choose_backend()
  Sourced<log::Level> log_level;  // the console level of the chosen ranks
  Sourced<LogRanks> log_ranks;
  Sourced<std::string> log_dir;            // "" = no log files
  Sourced<double> rdzv_log_interval_s;     // between rendezvous progress lines
  Sourced<double> heartbeat_interval_s;    // health monitor beats
  Sourced<std::string> check_collectives;  // "auto", "1" or "0"; See Note [Collective signature]
  Sourced<int64_t> flight_records;         // collectives each rank's flight recorder keeps
  Sourced<std::string> shared_memory;      // "auto", "1" or "0": Gloo's ranks on one host through shared memory
  Sourced<std::string> memory_dir;         // where each node keeps the trainer's in-memory checkpoints

  // The console level of `rank`: the log level where DTCORE_LOG_RANKS selects it, else warnings
  // and errors only.
  log::Level console_level(int rank) const;
};

// One keyword argument of init() as Python passed it (None: not given). Its type is checked
// here, where the value is used, not in the bindings.
using Argument = std::variant<bool, int64_t, double, std::string>;
using Arguments = std::map<std::string, std::optional<Argument>>;

// How a user wrote `value`, Python style: True, 5, 2.5, 'gloo'.
std::string repr(const Argument& value);

// `args` holds init()'s timeout, backend and log_dir (None or absent: not given; backend "auto"
// defers to DTCORE_BACKEND). Throws one ConfigError listing every bad value, unless `problems` is
// given: then each is appended there and the knob's default is used instead, so that the resource
// checker reports them item by item and goes on.
Settings read_settings(const Env& env, const Arguments& args = {}, std::vector<Problem>* problems = nullptr);

// The logging configuration of one rank under these settings.
log::Config log_config(const Settings& settings, int rank, int world_size, std::string host);

}  // namespace dtcore
