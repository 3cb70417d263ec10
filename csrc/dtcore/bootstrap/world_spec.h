// WorldSpec: the job's shape as seen by one process, and where each value came from.
//
// Built by read_world() (launcher.h) from a launcher's environment, DTCORE_* variables and
// init() arguments; checked by check_world() (validate.h). Every field remembers its source
// (the variable name, "init(rank=)", or how it was derived) so that an error can name the
// variable the user must change. Thread safety: a plain value.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dtcore {

enum class Launcher {
  Torchrun,    // torchrun / TorchElastic (TORCHELASTIC_RUN_ID)
  Accelerate,  // `accelerate launch` (ACCELERATE_* with the torchrun variables)
  Slurm,       // srun (SLURM_PROCID, ...)
  OpenMPI,     // mpirun from Open MPI (OMPI_COMM_WORLD_*)
  Mpich,       // MPICH / Intel MPI hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID)
  Env,         // RANK / WORLD_SIZE set by something else (a custom spawner, env:// style)
  Single,      // a plain process: world of one
};

std::string_view launcher_name(Launcher launcher);

template <typename T>
struct Sourced {
  T value{};
  std::string source;  // "RANK", "DTCORE_RANK", "init(rank=)", "derived from ...", "default"
};

struct WorldSpec {
  Launcher launcher = Launcher::Single;
  Sourced<int> rank;
  Sourced<int> world_size;
  Sourced<int> local_rank;
  Sourced<int> local_world_size;
  Sourced<int> node_rank;
  Sourced<int> num_nodes;
  Sourced<std::string> master_addr;
  Sourced<int> master_port;  // 0: choose a free port (single-node standalone only)
  // Total tasks over all nodes when the launcher reports uneven nodes (SLURM_TASKS_PER_NODE);
  // then it replaces num_nodes * local_world_size in validation.
  std::optional<Sourced<int>> tasks_over_nodes;
  // torchrun's agent already serves a TCPStore at master_addr:master_port; every rank
  // connects to it as a client instead of rank 0 serving (TORCHELASTIC_USE_AGENT_STORE).
  bool use_agent_store = false;
  // Bumped by torchrun on each restart; namespaces rendezvous keys in a long-lived agent store.
  int restart_count = 0;
  // Which CUDA devices this process sees (CUDA_VISIBLE_DEVICES), "" when unset; for messages.
  std::string cuda_visible_devices;

  std::string describe() const;  // one line for logs
};

}  // namespace dtcore
