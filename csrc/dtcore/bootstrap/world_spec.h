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

#include "dtcore/common/knobs.h"
#include "dtcore/common/sourced.h"

// Note [World fields]
// The eight values that place this process in the job, declared once, here. WorldSpec and
// WorldOverrides are generated from this list; read_world() applies DTCORE_* variables and init()
// arguments field by field through it; the Python binding of WorldSpec (and so dtcore.Context,
// which derives from it) exposes exactly these, and WorldSpec.FIELDS lists them in this order.
//   FIELD(type, name, knob): `knob` is the field's DTCORE_* variable (common/knobs.h).
#define DTCORE_WORLD_FIELDS(FIELD)                     \
  FIELD(int, rank, knobs::kRank)                       \
  FIELD(int, world_size, knobs::kWorldSize)            \
  FIELD(int, local_rank, knobs::kLocalRank)            \
  FIELD(int, local_world_size, knobs::kLocalWorldSize) \
  FIELD(int, node_rank, knobs::kNodeRank)              \
  FIELD(int, num_nodes, knobs::kNumNodes)              \
  FIELD(std::string, master_addr, knobs::kMasterAddr)  \
  FIELD(int, master_port, knobs::kMasterPort)

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

struct WorldSpec {
  Launcher launcher = Launcher::Single;
#define DTCORE_DECLARE_FIELD(type, name, knob) Sourced<type> name;
  DTCORE_WORLD_FIELDS(DTCORE_DECLARE_FIELD)  // master_port 0: a free port (single process only)
#undef DTCORE_DECLARE_FIELD
  // Total tasks over all nodes when the launcher reports uneven nodes (SLURM_TASKS_PER_NODE);
  // then it replaces num_nodes * local_world_size in validation.
  std::optional<Sourced<int>> tasks_over_nodes;
  // SLURM's node list as written (source: SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or
  // SLURM_NODELIST, whichever is set, in that order) and the number of hosts it names; unset
  // under other launchers. The job cannot span more nodes than that: validation checks num_nodes.
  std::optional<Sourced<std::string>> node_list;
  int node_list_hosts = 0;
  // torchrun's agent already serves a TCPStore at master_addr:master_port; every rank
  // connects to it as a client instead of rank 0 serving (TORCHELASTIC_USE_AGENT_STORE). This is
  // the one judgement of that variable: init() follows it and the checker reports it.
  bool use_agent_store = false;
  // Bumped by torchrun on each restart; namespaces rendezvous keys in a long-lived agent store.
  int restart_count = 0;
  // Which CUDA devices this process sees (CUDA_VISIBLE_DEVICES), "" when unset; for messages.
  std::string cuda_visible_devices;
  // The launcher's id of this job ("none" without one), e.g. TORCHELASTIC_RUN_ID=... : every
  // rank must report the same, or two jobs are meeting on one port.
  Sourced<std::string> job_id{"none", "default: no launcher job id"};

  std::string describe() const;  // one line for logs
};

}  // namespace dtcore
