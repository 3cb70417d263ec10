// dtcore._C bindings for the activation-checkpoint planner (csrc/dtcore/activation/plan.h).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "dtcore/activation/plan.h"

namespace py = pybind11;

namespace dtcore::bindings {

void bind_activation(py::module_& m) {
  using activation::BlockProfile;
  using activation::CheckpointPlan;
  using activation::Mode;

  py::enum_<Mode>(m, "CheckpointMode")
      .value("keep", Mode::kKeep)
      .value("full", Mode::kFull)
      .value("selective", Mode::kSelective);

  py::class_<BlockProfile>(m, "BlockProfile")
      .def(py::init([](std::string name, int64_t activation_bytes, int64_t input_bytes, double forward_seconds,
                       int64_t selective_bytes, double selective_seconds, int64_t selective_shared_bytes) {
             return BlockProfile{std::move(name), activation_bytes,  input_bytes,           forward_seconds,
                                 selective_bytes, selective_seconds, selective_shared_bytes};
           }),
           py::arg("name"), py::arg("activation_bytes"), py::arg("input_bytes"), py::arg("forward_seconds"),
           py::arg("selective_bytes") = -1, py::arg("selective_seconds") = 0.0, py::arg("selective_shared_bytes") = -1)
      .def_readonly("name", &BlockProfile::name)
      .def_readonly("activation_bytes", &BlockProfile::activation_bytes)
      .def_readonly("input_bytes", &BlockProfile::input_bytes)
      .def_readonly("forward_seconds", &BlockProfile::forward_seconds)
      .def_readonly("selective_bytes", &BlockProfile::selective_bytes)
      .def_readonly("selective_seconds", &BlockProfile::selective_seconds)
      .def_readonly("selective_shared_bytes", &BlockProfile::selective_shared_bytes)
      .def("__repr__", [](const BlockProfile& b) {
        return "BlockProfile(name='" + b.name + "', activation_bytes=" + std::to_string(b.activation_bytes) +
               ", input_bytes=" + std::to_string(b.input_bytes) +
               ", forward_seconds=" + std::to_string(b.forward_seconds) +
               ", selective_bytes=" + std::to_string(b.selective_bytes) +
               ", selective_seconds=" + std::to_string(b.selective_seconds) + ")";
      });

  py::class_<CheckpointPlan>(m, "CheckpointPlan")
      .def_readonly("feasible", &CheckpointPlan::feasible)
      .def_readonly("modes", &CheckpointPlan::modes)
      .def_readonly("peak_bytes", &CheckpointPlan::peak_bytes)
      .def_readonly("recompute_seconds", &CheckpointPlan::recompute_seconds)
      .def_readonly("min_peak_bytes", &CheckpointPlan::min_peak_bytes)
      .def_readonly("baseline_peak_bytes", &CheckpointPlan::baseline_peak_bytes);

  m.def("plan_checkpoints", &activation::plan_checkpoints, py::arg("blocks"), py::arg("fixed_bytes"),
        py::arg("budget_bytes"), py::call_guard<py::gil_scoped_release>(),
        "The least-recompute modes of the blocks under the budget (Note [Checkpoint peak model])");
  m.def("predicted_peak", &activation::predicted_peak, py::arg("blocks"), py::arg("fixed_bytes"), py::arg("modes"),
        "The activation peak of one choice (Note [Checkpoint peak model])");
  m.def("recompute_seconds", &activation::recompute_seconds, py::arg("blocks"), py::arg("modes"),
        "The recompute time of one choice");
}

}  // namespace dtcore::bindings
