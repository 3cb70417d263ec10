// Launcher probe: the same detection and validation as dtcore.init() (read_world, check_world),
// reported item by item, plus what contradicts the environment around it: a SLURM allocation
// whose nodes or GPUs do not match what torchrun or mpirun was told, and an `accelerate`
// configuration file that asks for more processes than the machine has GPUs.
// Thread safety: pure, except the DNS lookup of the master address (check_world).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtcore/bootstrap/accelerate.h"
#include "dtcore/bootstrap/launcher.h"
#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/check/item.h"
#include "dtcore/common/env.h"
#include "dtcore/common/sourced.h"

namespace dtcore::check {

struct LaunchExpectations {
  std::string backend = "gloo";  // what init() would choose here: "nccl" or "gloo"
  int visible_gpus = -1;         // GPUs this process sees; -1 when unknown
  std::string host;
  bool resolve_master = true;
  std::string accelerate_config_path;  // "" when there is none
  std::map<std::string, std::string> accelerate_config;
  Arguments world_arguments;  // init()'s rank=, world_size=, ...: they beat the environment
};

// Appends the launch.* items; returns the WorldSpec when the environment could be read.
std::optional<WorldSpec> judge_launch(const Env& env, const LaunchExpectations& expect, Items& out);

// One FAIL item per invalid setting or backend request (read_settings, choose_backend), named by
// the variable or argument the user set: "launch.<field>".
void judge_settings(const std::vector<Problem>& problems, Items& out);

}  // namespace dtcore::check
