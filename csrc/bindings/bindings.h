// The binding files of dtcore._C: module.cpp defines the module and calls one bind_<area>() per
// csrc/dtcore/<area>, each in its own csrc/bindings/<area>.cpp. Bindings only, no logic: what a
// binding needs beyond converting values belongs in the area it binds. (Walks of Python objects
// themselves, which only a binding can make, are the exception: checkpoint.cpp's encode_json, which
// converts a value into JSON, and TensorWatch.)
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <exception>
#include <map>
#include <optional>
#include <string>

#include "dtcore/common/env.h"

namespace dtcore::bindings {

// The environment a call was given (a test's), or this process's when None.
inline Env env_or_process(const std::optional<std::map<std::string, std::string>>& vars) {
  if (!vars) return Env::from_process();
  return Env(std::map<std::string, std::string, std::less<>>(vars->begin(), vars->end()));
}

// The attributes of a plain struct, as (name, member) pairs, read-only or assignable from Python:
//   fields<Access::kRead>(entry, "rank", &RosterEntry::rank, "host", &RosterEntry::host, ...);
enum class Access { kRead, kReadWrite };

template <Access kAccess, typename Class>
Class& fields(Class& cls) {
  return cls;
}
template <Access kAccess, typename Class, typename Member, typename... Rest>
Class& fields(Class& cls, const char* name, Member member, Rest... rest) {
  if constexpr (kAccess == Access::kReadWrite) {
    cls.def_readwrite(name, member);
  } else {
    cls.def_readonly(name, member);
  }
  return fields<kAccess>(cls, rest...);
}

// Throws `error` so that it reaches Python with its own class (dtcore.CommError, ...) through
// code that would otherwise make any C++ exception a RuntimeError, such as autograd's engine:
// the Python exception is made by the registered translators and carried as torch's python_error.
[[noreturn]] void rethrow_as_python_error(std::exception_ptr error);

void bind_common(pybind11::module_& m);      // errors, version, knobs, units, settings, logging
void bind_bootstrap(pybind11::module_& m);   // WorldSpec, read_world, validation, backend choice, rendezvous
void bind_comm(pybind11::module_& m);        // Work, Communicator, HealthMonitor, the Gloo and NCCL factories
void bind_reducer(pybind11::module_& m);     // ReducerOptions, Reducer
void bind_check(pybind11::module_& m);       // the resource checker's probes and judges
void bind_activation(pybind11::module_& m);  // the activation-checkpoint planner
void bind_checkpoint(pybind11::module_& m);  // atomic files, safetensors writing

}  // namespace dtcore::bindings
