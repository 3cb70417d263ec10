#include "dtcore/check/checker.h"

#include "dtcore/bootstrap/backend.h"
#include "dtcore/check/env_probe.h"
#include "dtcore/check/host_probe.h"
#include "dtcore/check/launch_probe.h"
#include "dtcore/check/network_probe.h"
#include "dtcore/common/deadline.h"
#include "dtcore/common/env.h"

namespace dtcore::check {
namespace {

// NVML answers in well under a second; a GPU that fell off the bus makes it hang for minutes.
constexpr std::chrono::milliseconds kGpuProbeDeadline{15000};

void append(std::vector<Item>& to, Items&& from) {
  for (Item& i : from.take()) to.push_back(std::move(i));
}

}  // namespace

CheckResult run_checks(const CheckInputs& in) {
  CheckResult r;
  const Env env(std::map<std::string, std::string, std::less<>>(in.env.begin(), in.env.end()));
  if (in.gpus) {
    r.gpus = *in.gpus;
  } else if (auto probed = with_deadline<GpuFacts>([] { return probe_gpus(); }, kGpuProbeDeadline)) {
    r.gpus = std::move(*probed);
  } else {
    r.gpus.hung = true;
  }
  const auto cvd = env.raw("CUDA_VISIBLE_DEVICES");  // unlike Env::get, "" is a value: it hides every GPU
  r.visible_gpus = r.gpus.driver_loaded ? static_cast<int>(visible_devices(cvd, r.gpus.devices).indices.size()) : 0;

  // The settings and the backend exactly as init() reads and chooses them; a bad value is an item.
  std::vector<Problem> settings_problems;
  r.settings = read_settings(env, in.settings_arguments, &settings_problems);
  BackendFacts bf;
  bf.cuda_devices = usable_gpus(r.gpus, r.visible_gpus, in.versions.torch_cuda);  // what init() counts
  bf.torch_version = in.versions.torch;
  bf.cuda_visible_devices = cvd.value_or("");
  r.backend = choose_backend(r.settings.backend, bf, &settings_problems).value_or("gloo");
  const bool gpu_required = r.settings.backend.value == "nccl";

  Items versions;
  VersionFacts vf = in.versions;
  vf.nccl_library = probe_nccl_library(in.nccl_dirs);
  vf.gpus_present = !r.gpus.devices.empty();
  judge_versions(vf, versions);

  Items launch;
  LaunchExpectations le;
  le.backend = r.backend;
  le.visible_gpus = r.visible_gpus;  // 0 without a driver: there are none
  le.host = in.host;
  le.resolve_master = false;  // the network probe owns DNS: one item, one lookup
  le.accelerate_config_path = in.accelerate_config_path;
  if (!in.accelerate_config_path.empty()) le.accelerate_config = parse_accelerate_config(in.accelerate_config_text);
  le.world_arguments = in.world_arguments;
  r.spec = judge_launch(env, le, launch);
  judge_settings(settings_problems, launch);

  Items gpus;
  GpuExpectations ge;
  ge.cuda_visible_devices = cvd;
  ge.torch_cuda = in.versions.torch_cuda;
  ge.arch_list = in.arch_list;
  ge.gpu_required = gpu_required;
  ge.local_world_size = r.spec ? r.spec->local_world_size.value : 1;
  ge.job_pids = in.job_pids;
  ge.launched = r.spec && r.spec->launcher != Launcher::Single;
  ge.pid_namespace = in.pid_namespace;
  judge_gpus(r.gpus, ge, gpus);

  Items network;
  if (r.spec) {
    NetworkOptions no;
    no.test_connect = in.distributed;
    no.probe_default_port = !in.preflight;
    WorldSpec planned = *r.spec;
    if (planned.master_port.value == 0 && !in.preflight) {
      // One process picks any free port; the port a launch will use is the one worth checking.
      auto port = env.get("MASTER_PORT");
      if (port && port->find_first_not_of("0123456789") == std::string::npos && port->size() <= 5) {
        planned.master_port = Sourced<int>{std::stoi(*port), "MASTER_PORT"};
      }
    }
    judge_network(probe_network(planned, env.get("NCCL_SOCKET_IFNAME"), env.get("GLOO_SOCKET_IFNAME"), no), network);
  }

  Items host;
  HostOptions ho;
  ho.shm_path = in.shm_path;
  if (in.checkpoint_dir || !in.preflight) ho.dirs.emplace_back("checkpoint directory", in.checkpoint_dir.value_or("."));
  if (!r.settings.log_dir.value.empty()) ho.dirs.emplace_back("log directory", r.settings.log_dir.value);
  HostExpectations he;
  he.world_size = r.spec ? r.spec->world_size.value : 1;
  he.local_world_size = r.spec ? r.spec->local_world_size.value : 1;
  he.gpus = r.backend == "nccl";
  he.num_nodes = r.spec ? r.spec->num_nodes.value : 1;
  he.serves_store = r.spec && r.spec->rank.value == 0 && !r.spec->use_agent_store;
  he.omp_num_threads = env.get("OMP_NUM_THREADS");
  he.min_free_disk_gb = in.min_free_disk_gb;
  judge_host(probe_host(ho), he, host);

  Items traps;
  TrapContext tc;
  tc.gpus = r.visible_gpus > 0;
  tc.wandb_installed = in.wandb_installed;
  tc.wandb_credentials = in.wandb_credentials;
  tc.agent_store = r.spec && r.spec->use_agent_store;
  judge_env_traps(env, tc, traps);

  for (Items* group : {&versions, &gpus, &launch, &network, &host, &traps}) append(r.items, std::move(*group));
  return r;
}

}  // namespace dtcore::check
