// The binding files of dtcore._C: module.cpp defines the module and calls one bind_<area>() per
// area, each in its own csrc/bindings/<area>.cpp; each adds its area's classes and functions to
// `m`. Bindings only, no logic.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "dtcore/bootstrap/world_spec.h"

namespace dtcore::bindings {

// The eight sourced fields of a WorldSpec as a dict: their values, or where each came from.
inline pybind11::dict world_fields(const WorldSpec& s, bool sources) {
  pybind11::dict d;
  auto put = [&](const char* key, const auto& field) {
    d[key] = sources ? pybind11::cast(field.source) : pybind11::cast(field.value);
  };
  put("rank", s.rank);
  put("world_size", s.world_size);
  put("local_rank", s.local_rank);
  put("local_world_size", s.local_world_size);
  put("node_rank", s.node_rank);
  put("num_nodes", s.num_nodes);
  put("master_addr", s.master_addr);
  put("master_port", s.master_port);
  return d;
}

void bind_check(pybind11::module_& m);  // csrc/bindings/check.cpp: the resource checker's probes

// dtcore._C.CheckpointMode, BlockProfile, CheckpointPlan, plan_checkpoints, predicted_peak,
// recompute_seconds (csrc/dtcore/activation/plan.h).
void bind_activation(pybind11::module_& m);

}  // namespace dtcore::bindings
