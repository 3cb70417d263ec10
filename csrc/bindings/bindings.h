// The binding functions that module.cpp calls from PYBIND11_MODULE, one per area of dtcore._C.
// Contract: each adds its area's classes and functions to `m`; bindings only, no logic.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace dtcore::bindings {

// dtcore._C.CheckpointMode, BlockProfile, CheckpointPlan, plan_checkpoints, predicted_peak,
// recompute_seconds (csrc/dtcore/activation/plan.h).
void bind_activation(pybind11::module_& m);

}  // namespace dtcore::bindings
