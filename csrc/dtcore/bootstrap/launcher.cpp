#include "dtcore/bootstrap/launcher.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <vector>

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
  std::optional<Sourced<std::string>> node_list;
  int node_list_hosts = 0;

  // A launcher variable the launcher always sets, found unset: an error unless a DTCORE_* variable
  // or an init() argument gives the field (explicit arguments complete the world), so it is
  // checked once those are applied (require_given).
  struct Required {
    std::optional<Sourced<int>> Partial::* field;
    const char* field_name;  // "rank", as in init(rank=)
    const char* variable;    // "RANK"
    const char* hint;        // why the environment looks like the launcher
  };
  std::vector<Required> required;
};

// Note [Launcher variables are read by presence]
// A launcher's own variable that is set counts as given, even when it is set to "": the launcher
// is detected by presence (SLURM_PROCID='' means SLURM), and a present variable must be valid, so
// SLURM_PROCID='' is a ConfigError naming it, never a silent "rank 0 of 1", and MASTER_PORT='' is
// never a silent 29500. Hence Env::raw() here. DTCORE_* knobs keep Env::get(), where "" means
// unset, by design (common/knobs.h).

// What a launcher variable holds, for the fix of an error about it.
struct VariableDoc {
  std::string_view name;
  std::string_view holds;
  std::string_view unset = {};  // what unsetting it does; empty: the launcher sets it
};

constexpr std::string_view kHostlist = "the job's hosts as a SLURM hostlist, e.g. gpu[01-04,07]";
constexpr VariableDoc kVariableDocs[] = {
    {"RANK", "this process's rank (0 .. world size - 1)"},
    {"WORLD_SIZE", "the number of processes in the job"},
    {"LOCAL_RANK", "this process's index on its node (0 .. processes on the node - 1)"},
    {"LOCAL_WORLD_SIZE", "the number of processes on this node"},
    {"GROUP_RANK", "this node's index (0 .. nodes - 1)"},
    {"NODE_RANK", "this node's index (0 .. nodes - 1)"},
    {"GROUP_WORLD_SIZE", "the number of nodes"},
    {"MASTER_ADDR", "rank 0's host name or IP address",
     "torchrun sets it, under srun dtcore uses the first host of the node list, on one node loopback"},
    {"MASTER_PORT", "a free TCP port such as 29500, the same on every rank",
     "torchrun sets it, under srun dtcore derives one from SLURM_JOB_ID, otherwise it uses 29500"},
    {"TORCHELASTIC_RUN_ID", "the job's id, the same on every rank"},
    {"TORCHELASTIC_RESTART_COUNT", "the number of restarts so far, such as 0"},
    {"SLURM_PROCID", "this task's rank (0 .. tasks - 1)"},
    {"SLURM_NTASKS", "the number of tasks in the job"},
    {"SLURM_NPROCS", "the number of tasks in the job"},
    {"SLURM_LOCALID", "this task's index on its node (0 .. tasks on the node - 1)"},
    {"SLURM_NODEID", "this node's index (0 .. nodes - 1)"},
    {"SLURM_NNODES", "the number of nodes in the job step"},
    {"SLURM_JOB_NUM_NODES", "the number of nodes in the job"},
    {"SLURM_TASKS_PER_NODE", "the tasks on each node as SLURM writes them, e.g. 4(x2),3"},
    {"SLURM_NTASKS_PER_NODE", "the number of tasks on each node"},
    {"SLURM_STEP_NODELIST", kHostlist},
    {"SLURM_JOB_NODELIST", kHostlist},
    {"SLURM_NODELIST", kHostlist},
    {"SLURM_JOB_ID", "the job's number, e.g. 123456"},
    {"OMPI_COMM_WORLD_RANK", "this process's rank (0 .. world size - 1)"},
    {"OMPI_COMM_WORLD_SIZE", "the number of processes in the job"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "this process's index on its node"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "the number of processes on this node"},
    {"OMPI_MCA_ess_base_jobid", "the job's id, the same on every rank"},
    {"PMI_RANK", "this process's rank (0 .. world size - 1)"},
    {"PMI_SIZE", "the number of processes in the job"},
    {"MPI_LOCALRANKID", "this process's index on its node"},
    {"MPI_LOCALNRANKS", "the number of processes on this node"},
    {"PMI_JOBID", "the job's id, the same on every rank"},
};

// "set SLURM_PROCID to this task's rank (0 .. tasks - 1), or unset it and let srun set it."
std::string fix_for(std::string_view name) {
  for (const VariableDoc& doc : kVariableDocs) {
    if (doc.name != name) continue;
    if (!doc.unset.empty()) return detail::cat("set ", name, " to ", doc.holds, ", or unset it: ", doc.unset, ".");
    std::string_view setter = name.starts_with("SLURM_")                             ? "srun"
                              : name.starts_with("OMPI_")                            ? "Open MPI's mpirun"
                              : name.starts_with("PMI_") || name.starts_with("MPI_") ? "mpiexec"
                                                                                     : "the launcher";
    return detail::cat("set ", name, " to ", doc.holds, ", or unset it and let ", setter, " set it.");
  }
  const bool knob = std::any_of(knobs::kAll.begin(), knobs::kAll.end(), [&](const Knob* k) { return k->name == name; });
  if (knob) {  // dtcore's own variable: no launcher sets it
    return detail::cat("set ", name, " to a whole number such as 0, or unset it to use the launcher's value.");
  }
  return detail::cat("set ", name, " to a whole number such as 0, or unset it and let the launcher set it.");
}

// A launcher variable as set; nullopt when it is not set at all, ConfigError when it is set to "".
// See Note [Launcher variables are read by presence].
std::optional<std::string> read_present(const Env& env, std::string_view name, Launcher launcher) {
  auto text = env.raw(name);
  DTCORE_CHECK(!text || !text->empty(), ConfigError, name, "='' is set but empty (launcher: ", launcher_name(launcher),
               "). Fix: ", fix_for(name));
  return text;
}

// `text` as a whole number in lo..hi, nothing else around it; nullopt otherwise.
std::optional<long> whole_number(const std::string& text, long lo, long hi) {
  long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < lo || value > hi) return std::nullopt;
  return value;
}

Sourced<int> parse_int(const std::string& text, std::string_view name, Launcher launcher) {
  auto value = whole_number(text, INT32_MIN, INT32_MAX);
  DTCORE_CHECK(value.has_value(), ConfigError, name, "='", text,
               "' is not an integer (launcher: ", launcher_name(launcher), "). Fix: ", fix_for(name));
  return Sourced<int>{static_cast<int>(*value), std::string(name)};
}

std::optional<Sourced<int>> read_int(const Env& env, std::string_view name, Launcher launcher) {
  auto text = read_present(env, name, launcher);
  if (!text) return std::nullopt;
  return parse_int(*text, name, launcher);
}

// Reads a variable the launcher always sets into `field`; an unset one is Partial::required.
void read_required(Partial& p, std::optional<Sourced<int>> Partial::* field, const char* field_name, const Env& env,
                   const char* name, Launcher launcher, const char* hint) {
  p.*field = read_int(env, name, launcher);
  if (!(p.*field)) p.required.push_back({field, field_name, name, hint});
}

// ConfigError for the first launcher variable that is unset and that nothing else gave.
void require_given(const Partial& p, Launcher launcher) {
  for (const Partial::Required& r : p.required) {
    if (p.*(r.field)) continue;
    throw ConfigError(detail::cat(r.variable, " is not set, but the environment looks like ", launcher_name(launcher),
                                  " (", r.hint, "). Fix: start the job with the launcher's own command (it sets ",
                                  r.variable, "), or set ", r.variable, " yourself (or pass init(", r.field_name,
                                  "=))."));
  }
}

std::optional<Sourced<std::string>> read_str(const Env& env, const char* name, Launcher launcher) {
  if (auto v = read_present(env, name, launcher)) return Sourced<std::string>{*v, name};
  return std::nullopt;
}

// torchrun, accelerate and plain env:// all speak the same variables.
Partial read_torch_style(const Env& env, Launcher launcher) {
  const char* hint = launcher == Launcher::Torchrun     ? "TORCHELASTIC_RUN_ID is set"
                     : launcher == Launcher::Accelerate ? "ACCELERATE_* variables are set"
                                                        : "RANK or WORLD_SIZE is set";
  Partial p;
  read_required(p, &Partial::rank, "rank", env, "RANK", launcher, hint);
  read_required(p, &Partial::world_size, "world_size", env, "WORLD_SIZE", launcher, hint);
  if (launcher == Launcher::Torchrun) {
    read_required(p, &Partial::local_rank, "local_rank", env, "LOCAL_RANK", launcher, hint);
    read_required(p, &Partial::local_world_size, "local_world_size", env, "LOCAL_WORLD_SIZE", launcher, hint);
  } else {
    p.local_rank = read_int(env, "LOCAL_RANK", launcher);
    p.local_world_size = read_int(env, "LOCAL_WORLD_SIZE", launcher);
  }
  p.node_rank = read_int(env, "GROUP_RANK", launcher);
  if (!p.node_rank) p.node_rank = read_int(env, "NODE_RANK", launcher);
  p.num_nodes = read_int(env, "GROUP_WORLD_SIZE", launcher);
  p.master_addr = read_str(env, "MASTER_ADDR", launcher);
  p.master_port = read_int(env, "MASTER_PORT", launcher);
  return p;
}

// SLURM_JOB_ID: SLURM numbers jobs from 1 (FirstJobId) within 32 bits.
std::optional<long> read_slurm_job_id(const Env& env) {
  auto text = read_present(env, "SLURM_JOB_ID", Launcher::Slurm);
  if (!text) return std::nullopt;
  auto id = whole_number(*text, 1, 4294967295L);
  DTCORE_CHECK(id.has_value(), ConfigError, "SLURM_JOB_ID='", *text,
               "' is not a SLURM job id, a whole number from 1 (launcher: slurm). Fix: ", fix_for("SLURM_JOB_ID"));
  return id;
}

Partial read_slurm(const Env& env) {
  const Launcher l = Launcher::Slurm;
  const char* hint = "SLURM_PROCID is set";
  Partial p;
  read_required(p, &Partial::rank, "rank", env, "SLURM_PROCID", l, hint);
  p.world_size = read_int(env, "SLURM_NTASKS", l);
  if (!p.world_size) p.world_size = read_int(env, "SLURM_NPROCS", l);  // the older name
  if (!p.world_size) p.required.push_back({&Partial::world_size, "world_size", "SLURM_NTASKS", hint});
  p.local_rank = read_int(env, "SLURM_LOCALID", l);
  p.node_rank = read_int(env, "SLURM_NODEID", l);
  p.num_nodes = read_int(env, "SLURM_NNODES", l);
  if (!p.num_nodes) p.num_nodes = read_int(env, "SLURM_JOB_NUM_NODES", l);
  // Tasks per node may be uneven ("4(x2),3"): this node's count, and the total for validation.
  if (auto tpn = read_present(env, "SLURM_TASKS_PER_NODE", l)) {
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
  // Every node list that is set must parse; the first names rank 0's host and bounds the node count.
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    auto list = read_present(env, var, l);
    if (!list) continue;
    size_t hosts = count_hosts(*list, var);
    if (!p.node_list) {
      p.node_list = Sourced<std::string>{*list, var};
      p.node_list_hosts = static_cast<int>(std::min<size_t>(hosts, INT32_MAX));
    }
  }
  p.master_addr = read_str(env, "MASTER_ADDR", l);
  if (!p.master_addr && p.node_list) {
    p.master_addr = Sourced<std::string>{first_host(p.node_list->value, p.node_list->source),
                                         "first host of " + p.node_list->source};
  }
  auto job = read_slurm_job_id(env);
  p.master_port = read_int(env, "MASTER_PORT", l);
  if (!p.master_port && job) {
    p.master_port = Sourced<int>{slurm_default_port(*job), "derived from SLURM_JOB_ID=" + std::to_string(*job)};
  }
  return p;
}

// Open MPI and MPICH report rank and per-node counts but neither node index nor rank 0's host.
Partial read_mpi(const Env& env, Launcher l) {
  const bool ompi = l == Launcher::OpenMPI;
  const char* hint = ompi ? "OMPI_COMM_WORLD_RANK is set" : "PMI_RANK is set";
  Partial p;
  read_required(p, &Partial::rank, "rank", env, ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK", l, hint);
  read_required(p, &Partial::world_size, "world_size", env, ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE", l, hint);
  p.local_rank = read_int(env, ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID", l);
  p.local_world_size = read_int(env, ompi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS", l);
  p.master_addr = read_str(env, "MASTER_ADDR", l);
  p.master_port = read_int(env, "MASTER_PORT", l);
  return p;
}

// The variable that holds the launcher's own job id, or nullptr.
const char* job_id_variable(Launcher launcher) {
  switch (launcher) {
    case Launcher::Torchrun:
    case Launcher::Accelerate: return "TORCHELASTIC_RUN_ID";
    case Launcher::Slurm: return "SLURM_JOB_ID";
    case Launcher::OpenMPI: return "OMPI_MCA_ess_base_jobid";
    case Launcher::Mpich: return "PMI_JOBID";
    case Launcher::Env:
    case Launcher::Single: return nullptr;
  }
  return nullptr;
}

// A DTCORE_* variable beats the launcher's; empty counts as unset (Env::get), as for every knob.
void apply_knob(std::optional<Sourced<int>>& field, const Env& env, const Knob& knob) {
  if (auto text = env.get(knob.name)) field = parse_int(*text, knob.name, Launcher::Env);
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

int slurm_default_port(long job_id) { return 15000 + static_cast<int>(job_id % 15000); }

// By presence: a variable set to "" still names its launcher. See Note [Launcher variables are read by presence].
Launcher detect_launcher(const Env& env) {
  const bool torch_style = env.present("RANK") || env.present("WORLD_SIZE");
  if (env.has_prefix("ACCELERATE_") && torch_style) return Launcher::Accelerate;
  if (env.present("TORCHELASTIC_RUN_ID")) return Launcher::Torchrun;
  if (env.present("OMPI_COMM_WORLD_RANK")) return Launcher::OpenMPI;
  if (env.present("PMI_RANK")) return Launcher::Mpich;
  if (env.present("SLURM_PROCID")) return Launcher::Slurm;
  if (torch_style) return Launcher::Env;
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
      if (env.present("RANK") || env.present("WORLD_SIZE")) p = read_torch_style(env, spec.launcher);
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
  require_given(p, spec.launcher);

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
  spec.node_list = p.node_list;
  spec.node_list_hosts = p.node_list_hosts;

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
  // The launcher's own id variable must not be empty; another launcher's empty one is skipped.
  if (const char* own_id = job_id_variable(spec.launcher)) read_present(env, own_id, spec.launcher);
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
