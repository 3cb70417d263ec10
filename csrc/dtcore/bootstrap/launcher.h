// Launcher detection: turns any launcher's environment into one WorldSpec.
//
// Precedence, per field: init() arguments beat DTCORE_* variables, which beat the launcher's
// variables; what none of them gives is derived (e.g. node rank = rank / local world size) or
// defaulted, and the field's `source` says which. Detection order, first match wins:
//   accelerate (ACCELERATE_*) > torchrun (TORCHELASTIC_RUN_ID) > Open MPI (OMPI_COMM_WORLD_RANK)
//   > MPICH/Intel MPI (PMI_RANK) > SLURM (SLURM_PROCID) > plain RANK/WORLD_SIZE > single process.
// torchrun and mpirun inside a SLURM allocation therefore win over the allocation's SLURM_*.
// A launcher's variable counts when it is set, even to "" (SLURM_PROCID='' is SLURM, not a single
// process), and one that is set must be readable: empty, not a number where one belongs, or a
// malformed SLURM list is a ConfigError naming it. See Note [Launcher variables are read by presence].
// Whether the values fit together is check_world()'s to judge (validate.h).
// Thread safety: pure functions of their arguments.
#pragma once

#include <optional>
#include <string>

#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/common/env.h"
#include "dtcore/common/settings.h"

namespace dtcore {

// The init() arguments that override the environment; unset fields defer to it.
// See Note [World fields].
struct WorldOverrides {
#define DTCORE_DECLARE_OVERRIDE(type, name, knob) std::optional<type> name;
  DTCORE_WORLD_FIELDS(DTCORE_DECLARE_OVERRIDE)
#undef DTCORE_DECLARE_OVERRIDE
};

// init()'s keyword arguments (rank=, world_size=, ..., master_port=) as WorldOverrides. None
// means not given. ConfigError for an unknown name (with the names it knows) or a value of the
// wrong type, naming the argument as the user wrote it.
WorldOverrides parse_overrides(const Arguments& arguments);

// Which launcher started this process, by the presence of its variables (see above).
Launcher detect_launcher(const Env& env);

// Throws ConfigError, on the first unreadable value, for a launcher variable that is set but empty
// or not an integer (or not a list, or not a job id, where one belongs), or a required variable
// that is missing, naming the variable, its value and the fix.
WorldSpec read_world(const Env& env, const WorldOverrides& overrides = {});

// The port a SLURM job uses when MASTER_PORT is unset: the same on every rank of the job,
// different across concurrent jobs, below the Linux ephemeral range. 15000 + job_id % 15000, for
// job_id >= 0 (read_world() refuses any other SLURM_JOB_ID).
int slurm_default_port(long job_id);

}  // namespace dtcore
