#include "dtcore/check/launch_probe.h"

#include "dtcore/bootstrap/launcher.h"
#include "dtcore/bootstrap/validate.h"
#include "dtcore/common/error.h"

namespace dtcore::check {
namespace {

std::optional<int> int_of(const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  try {
    size_t used = 0;
    int v = std::stoi(*s, &used);
    if (used == s->size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::optional<std::string> lookup(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// "Message. Fix: what to do." -> {"Message.", "what to do."}
std::pair<std::string, std::string> split_fix(const std::string& text) {
  size_t at = text.find(" Fix: ");
  if (at == std::string::npos) return {text, "correct the variable named above."};
  return {text.substr(0, at), text.substr(at + 6)};
}

// A SLURM allocation around a launcher that is not srun: its nodes and GPUs must cover the job.
void judge_slurm_allocation(const Env& env, const WorldSpec& s, const LaunchExpectations& e, Items& out) {
  // srun is judged by check_world itself; a plain shell inside an allocation (salloc) starts no job.
  if (s.launcher == Launcher::Slurm || s.launcher == Launcher::Single || !env.has("SLURM_JOB_ID")) return;
  auto nodes = int_of(env.get("SLURM_JOB_NUM_NODES"));
  if (!nodes) nodes = int_of(env.get("SLURM_NNODES"));
  const std::string launcher(launcher_name(s.launcher));
  if (nodes) {
    std::string value = detail::cat(launcher, " ", s.num_nodes.value, " node(s), SLURM allocation ", *nodes);
    if (s.num_nodes.value > *nodes) {
      out.fail("launch.slurm_nodes", "SLURM allocation", value,
               detail::cat(launcher, " expects ", s.num_nodes.value, " nodes (", s.num_nodes.source,
                           ") but the SLURM allocation has ", *nodes, ": the job waits for nodes that never come."),
               detail::cat("ask SLURM for ", s.num_nodes.value, " nodes (sbatch -N ", s.num_nodes.value, "), or start ",
                           launcher, " with --nnodes=", *nodes, "."));
    } else if (s.num_nodes.value < *nodes) {
      out.warn("launch.slurm_nodes", "SLURM allocation", value,
               detail::cat("the allocation has ", *nodes, " nodes but the job runs on ", s.num_nodes.value,
                           "; the others stay idle."),
               detail::cat("start ", launcher, " on every node (srun ... ", launcher, " --nnodes=", *nodes,
                           "), or allocate fewer nodes."));
    } else {
      out.pass("launch.slurm_nodes", "SLURM allocation", value);
    }
  }
  auto gpus = int_of(env.get("SLURM_GPUS_ON_NODE"));
  if (gpus && e.backend == "nccl" && s.local_world_size.value > *gpus) {
    out.fail("launch.slurm_gpus", "SLURM GPUs", detail::cat("SLURM_GPUS_ON_NODE=", *gpus),
             detail::cat(s.local_world_size.value, " processes per node (", s.local_world_size.source,
                         "), but SLURM gave this node ", *gpus, " GPU(s)."),
             detail::cat("request --gpus-per-node=", s.local_world_size.value, ", or start ", *gpus,
                         " processes per node (--nproc_per_node=", *gpus, ")."));
  }
}

// An accelerate config file read by the next `accelerate launch`; judged against this machine
// and, under accelerate, against what the launcher actually started.
void judge_accelerate_config(const Env& env, const WorldSpec& s, const LaunchExpectations& e, Items& out) {
  std::string fewer = accelerate_started_fewer(env, s, e.accelerate_config_path, e.accelerate_config);
  if (!fewer.empty()) {
    auto [message, fix] = split_fix(fewer);
    out.warn("launch.accelerate", "accelerate launch", "1 process", message, fix);
    return;
  }
  if (e.accelerate_config_path.empty()) return;
  const auto& c = e.accelerate_config;
  auto processes = int_of(lookup(c, "num_processes"));
  auto machines = int_of(lookup(c, "num_machines"));
  std::string type = lookup(c, "distributed_type").value_or("");
  bool use_cpu = ascii_lower(lookup(c, "use_cpu").value_or("false")) == "true";
  std::string value = detail::cat(e.accelerate_config_path, ": ", type.empty() ? "" : type + ", ",
                                  "num_processes=", processes ? std::to_string(*processes) : "?",
                                  ", num_machines=", machines ? std::to_string(*machines) : "?");
  const std::string fix_file =
      "edit the file (or run `accelerate config`) to match this machine, or pass "
      "--num_processes/--num_machines to accelerate launch.";
  if (type == "MULTI_GPU" && !use_cpu && e.visible_gpus == 0) {
    // accelerate launch starts MULTI_GPU's processes through torchrun, GPUs or not (MULTI_CPU starts one,
    // without mpirun), and dtcore.init() runs them on Gloo: the way to several processes on a CPU machine.
    // accelerate's own Accelerator() then counts one process in each, unless built with cpu=True.
    out.warn("launch.accelerate", "accelerate config", value,
             "the config asks for MULTI_GPU on a machine without a usable GPU: accelerate launch starts its "
             "processes through torchrun and dtcore runs them on Gloo, but a plain accelerate Accelerator() "
             "counts one process in each (distributed_type NO: data loaders not sharded, every process the main "
             "one).",
             "build the Accelerator with dtcore.integrations.accelerate (it passes cpu=True) or with "
             "Accelerator(cpu=True); or run where the GPUs are.");
    return;
  }
  if (processes && machines && *machines >= 1 && type == "MULTI_GPU" && e.visible_gpus > 0 &&
      *processes / *machines > e.visible_gpus) {
    out.fail("launch.accelerate", "accelerate config", value,
             detail::cat("the config starts ", *processes / *machines, " processes per machine, but this machine has ",
                         e.visible_gpus, " GPU(s): 'invalid device ordinal' at start-up."),
             fix_file);
    return;
  }
  if (s.launcher == Launcher::Accelerate && processes && *processes != s.world_size.value) {
    out.warn("launch.accelerate", "accelerate config", value,
             detail::cat("the config says num_processes=", *processes, " but this job has ", s.world_size.value, " (",
                         s.world_size.source, "): the launch command overrode the file."),
             fix_file);
    return;
  }
  out.pass("launch.accelerate", "accelerate config", value);
}

}  // namespace

std::optional<WorldSpec> judge_launch(const Env& env, const LaunchExpectations& e, Items& out) {
  WorldSpec spec;
  try {
    spec = read_world(env, parse_overrides(e.world_arguments));
  } catch (const ConfigError& err) {
    auto [message, fix] = split_fix(err.what());
    out.fail("launch.env", "launcher environment", "unreadable", message, fix);
    return std::nullopt;
  }
  out.pass("launch.launcher", "launcher", std::string(launcher_name(spec.launcher)), spec.describe());

  WorldCheckOptions o;
  o.backend = e.backend;
  o.visible_gpus = e.visible_gpus;
  o.host = e.host;
  o.resolve_master = e.resolve_master;
  auto problems = check_world(spec, o);
  std::map<std::string, int> seen;  // two problems with one field get distinct ids
  for (const Problem& p : problems) {
    std::string id = "launch." + p.field;
    if (int n = ++seen[p.field]; n > 1) id += detail::cat(".", n);
    out.fail(id, p.label(), p.value, p.message, p.fix);
  }
  if (problems.empty()) {
    out.pass("launch.world", "world",
             detail::cat("rank ", spec.rank.value, " of ", spec.world_size.value, ", ", spec.num_nodes.value,
                         " node(s) x ", spec.local_world_size.value, " process(es)"));
  }
  judge_slurm_allocation(env, spec, e, out);
  judge_accelerate_config(env, spec, e, out);
  return spec;
}

void judge_settings(const std::vector<Problem>& problems, Items& out) {
  for (const Problem& p : problems) out.fail("launch." + p.field, p.label(), p.value, p.message, p.fix);
}

}  // namespace dtcore::check
