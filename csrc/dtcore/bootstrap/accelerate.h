// `accelerate launch`: its config file, and what it was asked for against what it started.
//
// accelerate's simple launcher (`accelerate launch --cpu`, or no distributed mode) starts one
// process, whatever --num_processes says: several CPU processes need its multi-process mode
// (torchrun underneath) or mpirun. It sets MASTER_ADDR and MASTER_PORT only when asked for more
// than one process or machine, and sets no RANK or WORLD_SIZE, so one process trains alone and
// nothing complains. init() warns and the checker reports it (launch_probe.h), with this one rule.
// Thread safety: pure functions of their arguments.
#pragma once

#include <map>
#include <string>

#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/common/env.h"

namespace dtcore {

// The top-level "key: value" lines of an accelerate config file (YAML); nested keys are skipped.
std::map<std::string, std::string> parse_accelerate_config(const std::string& text);

// "" unless accelerate started this process alone (launcher accelerate, a world of one that no
// variable or argument set) although it was asked for more: MASTER_ADDR/MASTER_PORT set by
// `accelerate launch`, or num_processes > 1 in its config file `config_path` (parsed: `config`).
// Otherwise "<what happened>. Fix: <what to do>.", naming both.
std::string accelerate_started_fewer(const Env& env, const WorldSpec& spec, const std::string& config_path,
                                     const std::map<std::string, std::string>& config);

}  // namespace dtcore
