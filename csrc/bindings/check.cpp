// dtcore._C bindings of the resource checker (csrc/dtcore/check/). Bindings only, no logic.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "dtcore/check/checker.h"
#include "dtcore/comm/nccl_communicator.h"

namespace py = pybind11;

namespace dtcore::bindings {
namespace {

template <typename T>
T get_or(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) && !d[key].is_none() ? py::cast<T>(d[key]) : fallback;
}

check::VersionFacts version_facts(const py::dict& f) {
  check::VersionFacts v;
  v.python = get_or<std::string>(f, "python", "");
  v.torch = get_or<std::string>(f, "torch", "");
  v.torch_cuda = get_or<std::string>(f, "torch_cuda", "");
  v.torch_cxx11_abi = get_or<bool>(f, "torch_cxx11_abi", true);
  v.torch_nccl = get_or<std::string>(f, "torch_nccl", "");
  v.dtcore = get_or<std::string>(f, "dtcore", DTCORE_VERSION);
  v.built_torch = get_or<std::string>(f, "built_torch", DTCORE_TORCH_VERSION);
  v.built_cxx11_abi = get_or<bool>(f, "built_cxx11_abi", true);
  v.built_cuda = get_or<std::string>(f, "built_cuda", "");
#if defined(DTCORE_WITH_NCCL)
  v.built_with_nccl = get_or<bool>(f, "built_with_nccl", true);
#else
  v.built_with_nccl = get_or<bool>(f, "built_with_nccl", false);
#endif
  v.dtcore_nccl = get_or<std::string>(f, "dtcore_nccl", nccl_runtime_version());
  v.rebuild_command = get_or<std::string>(f, "rebuild_command", "pip install --no-build-isolation .");
  return v;
}

py::dict item_dict(const check::Item& i) {
  py::dict d;
  d["id"] = i.id;
  d["group"] = i.group();
  d["title"] = i.title;
  d["status"] = std::string(check::status_name(i.status));
  d["value"] = i.value;
  d["message"] = i.message;
  d["fix"] = i.fix;
  return d;
}

py::dict gpus_dict(const check::GpuFacts& g) {
  py::dict d;
  d["driver"] = g.driver_loaded ? g.driver_version : std::string();
  d["cuda_driver_version"] = g.cuda_driver_version;
  py::list devices;
  for (const auto& dev : g.devices) {
    py::dict x;
    x["index"] = dev.index;
    x["name"] = dev.name;
    x["uuid"] = dev.uuid;
    x["memory_total"] = dev.memory_total;
    x["memory_free"] = dev.memory_free;
    x["compute_capability"] = std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor);
    x["mig"] = dev.mig_enabled;
    devices.append(x);
  }
  d["devices"] = devices;
  return d;
}

}  // namespace

void bind_check(py::module_& m) {
  m.def(
      "run_checks",
      [](std::map<std::string, std::string> env, const py::dict& facts, std::vector<std::string> nccl_dirs,
         std::vector<std::string> arch_list, std::string host, std::string shm_path,
         std::vector<std::pair<std::string, std::string>> dirs, double min_free_disk_gb,
         std::string accelerate_config_path, std::string accelerate_config_text, bool wandb_installed,
         bool wandb_credentials, bool distributed, bool preflight, std::vector<unsigned> job_pids,
         bool pid_namespace) {
        check::CheckInputs in;
        in.env = std::move(env);
        in.versions = version_facts(facts);
        in.nccl_dirs = std::move(nccl_dirs);
        in.arch_list = std::move(arch_list);
        in.host = std::move(host);
        in.shm_path = std::move(shm_path);
        in.dirs = std::move(dirs);
        in.min_free_disk_gb = min_free_disk_gb;
        in.accelerate_config_path = std::move(accelerate_config_path);
        in.accelerate_config_text = std::move(accelerate_config_text);
        in.wandb_installed = wandb_installed;
        in.wandb_credentials = wandb_credentials;
        in.distributed = distributed;
        in.preflight = preflight;
        in.job_pids = std::move(job_pids);
        in.pid_namespace = pid_namespace;
        check::CheckResult r;
        {
          py::gil_scoped_release release;
          r = check::run_checks(in);
        }
        py::dict out;
        py::list items;
        for (const auto& i : r.items) items.append(item_dict(i));
        out["items"] = items;
        if (r.spec) {
          py::dict world = world_fields(*r.spec, false);
          world["launcher"] = std::string(launcher_name(r.spec->launcher));
          out["world"] = world;
        } else {
          out["world"] = py::none();
        }
        out["backend"] = r.backend;
        out["visible_gpus"] = r.visible_gpus;
        out["gpus"] = gpus_dict(r.gpus);
        return out;
      },
      py::arg("env"), py::arg("facts"), py::arg("nccl_dirs"), py::arg("arch_list"), py::arg("host"),
      py::arg("shm_path"), py::arg("dirs"), py::arg("min_free_disk_gb"), py::arg("accelerate_config_path"),
      py::arg("accelerate_config_text"), py::arg("wandb_installed"), py::arg("wandb_credentials"),
      py::arg("distributed"), py::arg("preflight"), py::arg("job_pids"), py::arg("pid_namespace"),
      "Runs every probe of this process and judges it; see csrc/dtcore/check/checker.h.");
}

}  // namespace dtcore::bindings
