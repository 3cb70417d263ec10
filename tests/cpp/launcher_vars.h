// The variables each launcher sets, as a test's environment: one rank of a small job, to read
// with read_world(Env(vars)) as given or after changing a variable.
#pragma once

#include <functional>
#include <map>
#include <string>

namespace dtcore::testing {

using Vars = std::map<std::string, std::string, std::less<>>;

// Rank 5 of 16 under torchrun: 2 nodes of 8, on the agent's store, after 2 restarts.
inline Vars torchrun_vars() {
  return {{"TORCHELASTIC_RUN_ID", "job1"},
          {"RANK", "5"},
          {"WORLD_SIZE", "16"},
          {"LOCAL_RANK", "5"},
          {"LOCAL_WORLD_SIZE", "8"},
          {"GROUP_RANK", "0"},
          {"GROUP_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node-a"},
          {"MASTER_PORT", "29400"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_RESTART_COUNT", "2"}};
}

// Rank 0 of 2 under srun on one node, as tests/py/launch_helpers.py's slurm_style.
inline Vars slurm_vars() {
  return {{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "2"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "0"},
          {"SLURM_NNODES", "1"},
          {"SLURM_TASKS_PER_NODE", "2"},
          {"SLURM_JOB_NODELIST", "localhost"},
          {"SLURM_JOB_ID", "4242"},
          {"MASTER_PORT", "29400"}};
}

// Plain env:// style, rank 0 of 2.
inline Vars env_style_vars() {
  return {{"RANK", "0"},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "0"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29400"}};
}

}  // namespace dtcore::testing
