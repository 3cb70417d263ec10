// dtcore._C bindings of the resource checker (csrc/dtcore/check/). Bindings only, no logic.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "dtcore/check/checker.h"

namespace py = pybind11;

namespace dtcore::bindings {

void bind_check(py::module_& m) {
  using namespace dtcore::check;  // the checker's plain structs, bound one by one below

  py::class_<VersionFacts> versions(m, "VersionFacts");
  versions.def(py::init<>());
  fields<Access::kReadWrite>(versions, "python", &VersionFacts::python, "torch", &VersionFacts::torch, "torch_cuda",
                             &VersionFacts::torch_cuda, "torch_cxx11_abi", &VersionFacts::torch_cxx11_abi, "torch_nccl",
                             &VersionFacts::torch_nccl, "dtcore", &VersionFacts::dtcore, "built_torch",
                             &VersionFacts::built_torch, "built_cxx11_abi", &VersionFacts::built_cxx11_abi,
                             "built_cuda", &VersionFacts::built_cuda, "built_with_nccl", &VersionFacts::built_with_nccl,
                             "dtcore_nccl", &VersionFacts::dtcore_nccl, "rebuild_command",
                             &VersionFacts::rebuild_command);

  using In = CheckInputs;
  py::class_<In> inputs(m, "CheckInputs");
  inputs.def(py::init<>());
  fields<Access::kReadWrite>(
      inputs, "env", &In::env, "world_arguments", &In::world_arguments, "settings_arguments", &In::settings_arguments,
      "versions", &In::versions, "nccl_dirs", &In::nccl_dirs, "arch_list", &In::arch_list, "host", &In::host,
      "shm_path", &In::shm_path, "checkpoint_dir", &In::checkpoint_dir, "min_free_disk_gb", &In::min_free_disk_gb,
      "accelerate_config_path", &In::accelerate_config_path, "accelerate_config_text", &In::accelerate_config_text,
      "wandb_installed", &In::wandb_installed, "wandb_credentials", &In::wandb_credentials, "distributed",
      &In::distributed, "preflight", &In::preflight, "job_pids", &In::job_pids, "pid_namespace", &In::pid_namespace);

  py::class_<Item> item(m, "CheckItem");
  fields<Access::kRead>(item, "id", &Item::id, "title", &Item::title, "value", &Item::value, "message", &Item::message,
                        "fix", &Item::fix);
  item.def_property_readonly("group", &Item::group).def_property_readonly("status", [](const Item& i) {
    return std::string(status_name(i.status));
  });

  py::class_<GpuDevice> device(m, "GpuDevice");
  fields<Access::kRead>(device, "index", &GpuDevice::index, "name", &GpuDevice::name, "uuid", &GpuDevice::uuid,
                        "memory_total", &GpuDevice::memory_total, "memory_free", &GpuDevice::memory_free, "cc_major",
                        &GpuDevice::cc_major, "cc_minor", &GpuDevice::cc_minor, "mig_enabled", &GpuDevice::mig_enabled);
  py::class_<GpuFacts> gpus(m, "GpuFacts");
  fields<Access::kRead>(gpus, "driver_loaded", &GpuFacts::driver_loaded, "driver_version", &GpuFacts::driver_version,
                        "cuda_driver_version", &GpuFacts::cuda_driver_version, "devices", &GpuFacts::devices);

  py::class_<CheckResult> result(m, "CheckResult");
  fields<Access::kRead>(result, "items", &CheckResult::items, "spec", &CheckResult::spec, "settings",
                        &CheckResult::settings, "backend", &CheckResult::backend, "visible_gpus",
                        &CheckResult::visible_gpus, "gpus", &CheckResult::gpus);

  m.def("run_checks", &run_checks, py::arg("inputs"), py::call_guard<py::gil_scoped_release>(),
        "Runs every probe of this process and judges it; see csrc/dtcore/check/checker.h");
}

}  // namespace dtcore::bindings
