#include "dtcore/bootstrap/launcher.h"

#include <charconv>

#include "dtcore/bootstrap/hostlist.h"
#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"

namespace dtcore {
namespace {

constexpr int kDefaultMasterPort = 29500;  // torch's default, so mixed tooling agrees

// The parts of a WorldSpec a launcher may supply; unset ones are derived later.
struct Partial {
#define DTCORE_DECLARE_PARTIAL(type, name, knob) std::optional<Sourced<type>> name;
  DTCORE_WORLD_FIELDS(DTCORE_DECLARE_PARTIAL)
#undef DTCORE_DECLARE_PARTIAL
  std::optional<Sourced<int>> tasks_over_nodes;
};

std::optional<Sourced<int>> read_int(const Env& env, std::string_view name, Launcher launcher) {
  auto text = env.get(name);
  if (!text) return std::nullopt;
  long value = 0;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  DTCORE_CHECK(ec == std::errc() && ptr == end && value >= INT32_MIN && value <= INT32_MAX, ConfigError, name, "='",
               *text, "' is not an integer (launcher: ", launcher_name(launcher), "). Fix: set ", name,
               " to a whole number such as 0, or unset it and let the launcher set it.");
  return Sourced<int>{static_cast<int>(value), std::string(name)};
}

Sourced<int> require_int(const Env& env, const char* name, Launcher launcher, const char* hint) {
  auto v = read_int(env, name, launcher);
  DTCORE_CHECK(v.has_value(), ConfigError, name, " is not set, but the environment looks like ",
               launcher_name(launcher), " (", hint, "). Fix: start the job with the launcher's own command (it sets ",
               name, "), or set ", name, " yourself.");
  return *v;
}

std::optional<Sourced<std::string>> read_str(const Env& env, const char* name) {
  if (auto v = env.get(name)) return Sourced<std::string>{*v, name};
  return std::nullopt;
}

// torchrun, accelerate and plain env:// all speak the same variables.
Partial read_torch_style(const Env& env, Launcher launcher) {
  const char* hint = launcher == Launcher::Torchrun     ? "TORCHELASTIC_RUN_ID is set"
                     : launcher == Launcher::Accelerate ? "ACCELERATE_* variables are set"
                                                        : "RANK or WORLD_SIZE is set";
  Partial p;
  p.rank = require_int(env, "RANK", launcher, hint);
  p.world_size = require_int(env, "WORLD_SIZE", launcher, hint);
  if (launcher == Launcher::Torchrun) {
    p.local_rank = require_int(env, "LOCAL_RANK", launcher, hint);
    p.local_world_size = require_int(env, "LOCAL_WORLD_SIZE", launcher, hint);
  } else {
    p.local_rank = read_int(env, "LOCAL_RANK", launcher);
    p.local_world_size = read_int(env, "LOCAL_WORLD_SIZE", launcher);
  }
  p.node_rank = read_int(env, "GROUP_RANK", launcher);
  if (!p.node_rank) p.node_rank = read_int(env, "NODE_RANK", launcher);
  p.num_nodes = read_int(env, "GROUP_WORLD_SIZE", launcher);
  p.master_addr = read_str(env, "MASTER_ADDR");
  p.master_port = read_int(env, "MASTER_PORT", launcher);
  return p;
}

Partial read_slurm(const Env& env) {
  const Launcher l = Launcher::Slurm;
  Partial p;
  p.rank = require_int(env, "SLURM_PROCID", l, "SLURM_PROCID is set");
  p.world_size = read_int(env, "SLURM_NTASKS", l);
  if (!p.world_size) p.world_size = require_int(env, "SLURM_NPROCS", l, "SLURM_PROCID is set");
  p.local_rank = read_int(env, "SLURM_LOCALID", l);
  p.node_rank = read_int(env, "SLURM_NODEID", l);
  p.num_nodes = read_int(env, "SLURM_NNODES", l);
  if (!p.num_nodes) p.num_nodes = read_int(env, "SLURM_JOB_NUM_NODES", l);
  // Tasks per node may be uneven ("4(x2),3"): this node's count, and the total for validation.
  if (auto tpn = env.get("SLURM_TASKS_PER_NODE")) {
    auto counts = expand_tasks_per_node(*tpn, "SLURM_TASKS_PER_NODE");
    long total = 0;
    for (int c : counts) total += c;
    p.tasks_over_nodes = Sourced<int>{static_cast<int>(total), "SLURM_TASKS_PER_NODE"};
    int node = p.node_rank ? p.node_rank->value : 0;
    if (node >= 0 && node < static_cast<int>(counts.size())) {
      p.local_world_size = Sourced<int>{counts[static_cast<size_t>(node)], "SLURM_TASKS_PER_NODE"};
    }
  }
  if (!p.local_world_size) p.local_world_size = read_int(env, "SLURM_NTASKS_PER_NODE", l);
  p.master_addr = read_str(env, "MASTER_ADDR");
  if (!p.master_addr) {
    for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = env.get(var)) {
        p.master_addr = Sourced<std::string>{first_host(*list, var), std::string("first host of ") + var};
        break;
      }
    }
  }
  p.master_port = read_int(env, "MASTER_PORT", l);
  if (!p.master_port) {
    if (auto job = read_int(env, "SLURM_JOB_ID", l)) {
      p.master_port =
          Sourced<int>{slurm_default_port(job->value), "derived from SLURM_JOB_ID=" + std::to_string(job->value)};
    }
  }
  return p;
}

// Open MPI and MPICH report rank and per-node counts but neither node index nor rank 0's host.
Partial read_mpi(const Env& env, Launcher l) {
  const bool ompi = l == Launcher::OpenMPI;
  const char* hint = ompi ? "OMPI_COMM_WORLD_RANK is set" : "PMI_RANK is set";
  Partial p;
  p.rank = require_int(env, ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK", l, hint);
  p.world_size = require_int(env, ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE", l, hint);
  p.local_rank = read_int(env, ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID", l);
  p.local_world_size = read_int(env, ompi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS", l);
  p.master_addr = read_str(env, "MASTER_ADDR");
  p.master_port = read_int(env, "MASTER_PORT", l);
  return p;
}

// A DTCORE_* variable beats the launcher's.
void apply_knob(std::optional<Sourced<int>>& field, const Env& env, const Knob& knob) {
  if (auto v = read_int(env, knob.name, Launcher::Env)) field = v;
}
void apply_knob(std::optional<Sourced<std::string>>& field, const Env& env, const Knob& knob) {
  if (auto v = knob_value(env, knob)) field = Sourced<std::string>{*v, std::string(knob.name)};
}

// An init() argument beats both.
template <typename T>
void apply_argument(std::optional<Sourced<T>>& field, const std::optional<T>& value, std::string source) {
  if (value) field = Sourced<T>{*value, std::move(source)};
}

// The value of init(key=...) for a field of type T; ConfigError when it has another type.
template <typename T>
T override_value(const std::string& key, const Argument& value);

template <>
int override_value<int>(const std::string& key, const Argument& value) {
  const int64_t* v = std::get_if<int64_t>(&value);
  DTCORE_CHECK(v != nullptr && *v >= INT32_MIN && *v <= INT32_MAX, ConfigError, "init(", key, "=", repr(value),
               ") must be an integer. Fix: pass a whole number, e.g. ", key, "=0.");
  return static_cast<int>(*v);
}

template <>
std::string override_value<std::string>(const std::string& key, const Argument& value) {
  const std::string* v = std::get_if<std::string>(&value);
  DTCORE_CHECK(v != nullptr, ConfigError, "init(", key, "=", repr(value),
               ") must be a string. Fix: pass a host name or address, e.g. ", key, "='10.0.0.1'.");
  return *v;
}

// "rank, world_size, ..., master_port", for messages. See Note [World fields].
std::string field_names() {
  std::string out;
#define DTCORE_NAME(type, name, knob) \
  if (!out.empty()) out += ", ";      \
  out += #name;
  DTCORE_WORLD_FIELDS(DTCORE_NAME)
#undef DTCORE_NAME
  return out;
}

}  // namespace

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::Torchrun: return "torchrun";
    case Launcher::Accelerate: return "accelerate";
    case Launcher::Slurm: return "slurm";
    case Launcher::OpenMPI: return "openmpi";
    case Launcher::Mpich: return "mpich";
    case Launcher::Env: return "env";
    case Launcher::Single: return "single";
  }
  return "unknown";
}

int slurm_default_port(long job_id) { return 15000 + static_cast<int>((job_id < 0 ? -job_id : job_id) % 15000); }

Launcher detect_launcher(const Env& env) {
  if (env.has_prefix("ACCELERATE_") && (env.has("RANK") || env.has("WORLD_SIZE"))) return Launcher::Accelerate;
  if (env.has("TORCHELASTIC_RUN_ID")) return Launcher::Torchrun;
  if (env.has("OMPI_COMM_WORLD_RANK")) return Launcher::OpenMPI;
  if (env.has("PMI_RANK")) return Launcher::Mpich;
  if (env.has("SLURM_PROCID")) return Launcher::Slurm;
  if (env.has("RANK") || env.has("WORLD_SIZE")) return Launcher::Env;
  if (env.has_prefix("ACCELERATE_")) return Launcher::Accelerate;  // accelerate, one process
  return Launcher::Single;
}

WorldSpec read_world(const Env& env, const WorldOverrides& o) {
  WorldSpec spec;
  spec.launcher = detect_launcher(env);
  Partial p;
  switch (spec.launcher) {
    case Launcher::Torchrun:
    case Launcher::Env: p = read_torch_style(env, spec.launcher); break;
    case Launcher::Accelerate:
      if (env.has("RANK") || env.has("WORLD_SIZE")) p = read_torch_style(env, spec.launcher);
      break;
    case Launcher::Slurm: p = read_slurm(env); break;
    case Launcher::OpenMPI:
    case Launcher::Mpich: p = read_mpi(env, spec.launcher); break;
    case Launcher::Single: break;
  }

    // DTCORE_* variables beat the launcher's, init() arguments beat both. See Note [World fields].
#define DTCORE_APPLY(type, name, knob) \
  apply_knob(p.name, env, knob);       \
  apply_argument(p.name, o.name, "init(" #name "=)");
  DTCORE_WORLD_FIELDS(DTCORE_APPLY)
#undef DTCORE_APPLY

  if (spec.launcher == Launcher::Single && (p.world_size || p.rank)) spec.launcher = Launcher::Env;

  // What nobody gave is derived; the source says how, so errors stay precise.
  if (!p.world_size) {
    DTCORE_CHECK(!p.rank || p.rank->value == 0, ConfigError, p.rank->source, "=", p.rank->value,
                 " is given but no world size is. Fix: set WORLD_SIZE (or ", knobs::kWorldSize.name,
                 ", or init(world_size=)).");
    p.world_size = Sourced<int>{1, "default: no launcher found, a single process"};
  }
  if (!p.rank) {
    DTCORE_CHECK(p.world_size->value == 1, ConfigError, p.world_size->source, "=", p.world_size->value,
                 " is given but no rank is. Fix: set RANK (or ", knobs::kRank.name,
                 ", or init(rank=)) in every process.");
    p.rank = Sourced<int>{0, "default: a world of one"};
  }
  spec.rank = *p.rank;
  spec.world_size = *p.world_size;
  const int world = spec.world_size.value;
  if (!p.local_world_size) {
    if (p.num_nodes && p.num_nodes->value > 0 && world % p.num_nodes->value == 0) {
      p.local_world_size = Sourced<int>{world / p.num_nodes->value, "derived: world size / number of nodes"};
    } else {
      p.local_world_size = Sourced<int>{world, "default: no local size given, one node assumed"};
    }
  }
  spec.local_world_size = *p.local_world_size;
  const int local_world = spec.local_world_size.value > 0 ? spec.local_world_size.value : 1;
  if (!p.node_rank) p.node_rank = Sourced<int>{spec.rank.value / local_world, "derived: rank / local world size"};
  spec.node_rank = *p.node_rank;
  if (!p.local_rank) {
    p.local_rank = Sourced<int>{spec.rank.value - spec.node_rank.value * local_world,
                                "derived: rank - node rank * local world size"};
  }
  spec.local_rank = *p.local_rank;
  if (!p.num_nodes) {
    p.num_nodes = Sourced<int>{(world + local_world - 1) / local_world, "derived: world size / local world size"};
  }
  spec.num_nodes = *p.num_nodes;
  spec.tasks_over_nodes = p.tasks_over_nodes;

  if (!p.master_addr) {
    DTCORE_CHECK(spec.num_nodes.value <= 1, ConfigError, "MASTER_ADDR is not set and the job spans ",
                 spec.num_nodes.value, " nodes (", spec.num_nodes.source, "); ", launcher_name(spec.launcher),
                 " does not tell which host runs rank 0. Fix: set MASTER_ADDR to rank 0's host name in every process"
                 " (with Open MPI: mpirun -x MASTER_ADDR=<host> -x MASTER_PORT=29500 ...).");
    p.master_addr = Sourced<std::string>{"127.0.0.1", "default: one node, loopback"};
  }
  spec.master_addr = *p.master_addr;
  if (!p.master_port) {
    p.master_port = world == 1 ? Sourced<int>{0, "default: one process, any free port"}
                               : Sourced<int>{kDefaultMasterPort, "default: torch's 29500"};
  }
  spec.master_port = *p.master_port;

  if (spec.launcher == Launcher::Torchrun || spec.launcher == Launcher::Accelerate) {
    auto agent = env.get("TORCHELASTIC_USE_AGENT_STORE");
    // The agent serves at MASTER_ADDR:MASTER_PORT; an overridden address or port is not the agent's.
    bool address_is_launchers = spec.master_addr.source == "MASTER_ADDR" && spec.master_port.source == "MASTER_PORT";
    spec.use_agent_store = agent && truthy(*agent) && address_is_launchers;
    if (auto restarts = read_int(env, "TORCHELASTIC_RESTART_COUNT", spec.launcher)) {
      spec.restart_count = restarts->value;
    }
  }
  spec.cuda_visible_devices = env.get("CUDA_VISIBLE_DEVICES").value_or("");
  for (const char* var : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMI_JOBID"}) {
    if (auto id = env.get(var)) {
      spec.job_id = Sourced<std::string>{*id, var};
      break;
    }
  }
  return spec;
}

WorldOverrides parse_overrides(const Arguments& arguments) {
  WorldOverrides o;
  for (const auto& [key, value] : arguments) {
    bool known = false;
#define DTCORE_PARSE(type, name, knob)                     \
  if (key == #name) {                                      \
    known = true;                                          \
    if (value) o.name = override_value<type>(key, *value); \
  }
    DTCORE_WORLD_FIELDS(DTCORE_PARSE)
#undef DTCORE_PARSE
    DTCORE_CHECK(known, ConfigError, "init() got an unknown argument '", key, "'. Fix: use one of ", field_names(),
                 ".");
  }
  return o;
}

std::string WorldSpec::describe() const {
  return detail::cat("launcher=", launcher_name(launcher), " rank=", rank.value, "/", world_size.value,
                     " local_rank=", local_rank.value, "/", local_world_size.value, " node=", node_rank.value, "/",
                     num_nodes.value, " master=", master_addr.value, ":", master_port.value,
                     use_agent_store ? " (torchrun agent store)" : "", job_id.value != "none" ? " job=" : "",
                     job_id.value != "none" ? job_id.value : "");
}

}  // namespace dtcore
