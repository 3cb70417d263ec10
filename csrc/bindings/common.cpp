// dtcore._C bindings of csrc/dtcore/common: errors, the build's version, knobs, units, settings
// and the logging facade. Bindings only, no logic.
#include <pybind11/stl.h>

#include <thread>

#include <torch/csrc/Exceptions.h>

#include "bindings/bindings.h"
#include "dtcore/common/error.h"
#include "dtcore/common/interrupt.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/log.h"
#include "dtcore/common/settings.h"
#include "dtcore/common/units.h"

namespace py = pybind11;

namespace dtcore::bindings {

void rethrow_as_python_error(std::exception_ptr error) {
  python_error carried;
  {
    py::gil_scoped_acquire gil;
    try {
      std::rethrow_exception(error);
    } catch (...) {
      py::detail::try_translate_exceptions();  // sets the Python error, as a bound call would
    }
    carried.persist();  // fetched now, so that it may cross threads (autograd's) intact
  }
  throw carried;
}

void bind_common(py::module_& m) {
  // Long C++ waits end on Ctrl-C: see interrupt.h.
  // Python runs signal handlers on its main thread only: other threads never take the GIL for it.
  static const std::thread::id main_thread = std::this_thread::get_id();  // the importing thread
  set_interrupt_check([] {
    if (std::this_thread::get_id() != main_thread) return false;
    py::gil_scoped_acquire gil;
    return PyErr_CheckSignals() != 0;  // the signal's handler ran and raised (KeyboardInterrupt)
  });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Interrupted&) {
      if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);  // else: the handler's own error
    }
  });

  m.attr("__version__") = DTCORE_VERSION;
  m.attr("built_torch_version") = DTCORE_TORCH_VERSION;

  // Errors: the base first, so that the more specific translators (registered later) are tried first.
  auto& base = py::register_exception<Error>(m, "DtcoreError", PyExc_RuntimeError);
  // A bad setting or argument is a ValueError too, so that `except ValueError` catches it.
  py::register_exception<ConfigError>(m, "ConfigError", py::make_tuple(base, py::handle(PyExc_ValueError)));
  py::register_exception<RendezvousError>(m, "RendezvousError", base.ptr());
  py::register_exception<CommError>(m, "CommError", base.ptr());
  py::register_exception<CheckpointError>(m, "CheckpointError", base.ptr());
  // The docstrings docs/api.md shows (the kinds of csrc/dtcore/common/error.h).
  base.doc() = "The base of every error dtcore raises; the message names what, where, and the fix.";
  m.attr("ConfigError").doc() =
      "A bad launcher environment, DTCORE_* variable or argument, raised before anything starts; also a ValueError.";
  m.attr("RendezvousError").doc() =
      "The ranks could not meet: timeout with missing ranks, port taken, store unreachable, version mismatch.";
  m.attr("CommError").doc() = "A collective failed or timed out, or a peer rank died.";
  m.attr("CheckpointError").doc() = "A checkpoint could not be written, read or verified.";

  m.def(
      "knobs",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string>> out;
        for (const Knob* k : knobs::kAll) out.emplace_back(k->name, k->default_value, k->doc);
        return out;
      },
      "Every DTCORE_* variable as (name, default, doc), in the order of docs/knobs.md");
  m.def(
      "unknown_knobs",
      [](const std::optional<std::map<std::string, std::string>>& env) { return unknown_knobs(env_or_process(env)); },
      py::arg("env") = py::none(),
      "A line for each DTCORE_* variable set that no knob declares, naming the closest knob (the process's "
      "environment unless `env` is given)");

  m.def("parse_bytes", &parse_bytes, py::arg("text"), py::arg("what") = "size",
        "'2GB' -> 2*10^9, '1.5GiB' -> 1.5*2^30, '4096' -> 4096; ConfigError naming `what` otherwise");
  m.def("format_bytes", &format_bytes, py::arg("bytes"), "8 -> '8 B', 65536 -> '64 KiB', 1.5*2^30 -> '1.5 GiB'");

  py::class_<Settings>(m, "Settings")
      .def_property_readonly("timeout_s", [](const Settings& s) { return s.timeout_s.value; })
      .def_property_readonly("backend", [](const Settings& s) { return s.backend.value; })
      .def_property_readonly("log_level",
                             [](const Settings& s) { return std::string(log::level_name(s.log_level.value)); })
      .def_property_readonly("log_ranks", [](const Settings& s) { return s.log_ranks.value.to_string(); })
      .def_property_readonly("log_dir", [](const Settings& s) { return s.log_dir.value; })
      .def_property_readonly("rdzv_log_interval_s", [](const Settings& s) { return s.rdzv_log_interval_s.value; })
      .def_property_readonly("heartbeat_interval_s", [](const Settings& s) { return s.heartbeat_interval_s.value; })
      .def_property_readonly("check_collectives", [](const Settings& s) { return s.check_collectives.value; })
      .def_property_readonly("flight_records", [](const Settings& s) { return s.flight_records.value; })
      .def_property_readonly("shared_memory", [](const Settings& s) { return s.shared_memory.value; })
      .def_property_readonly("memory_dir", [](const Settings& s) { return s.memory_dir.value; })
      .def_property_readonly("sources",
                             [](const Settings& s) {
                               return std::map<std::string, std::string>{
                                   {"timeout_s", s.timeout_s.source},
                                   {"backend", s.backend.source},
                                   {"log_level", s.log_level.source},
                                   {"log_ranks", s.log_ranks.source},
                                   {"log_dir", s.log_dir.source},
                                   {"rdzv_log_interval_s", s.rdzv_log_interval_s.source},
                                   {"heartbeat_interval_s", s.heartbeat_interval_s.source},
                                   {"check_collectives", s.check_collectives.source},
                                   {"flight_records", s.flight_records.source},
                                   {"shared_memory", s.shared_memory.source},
                                   {"memory_dir", s.memory_dir.source}};
                             })
      .def(
          "console_level",
          [](const Settings& s, int rank) { return std::string(log::level_name(s.console_level(rank))); },
          py::arg("rank"));
  m.def(
      "read_settings",
      [](const Arguments& arguments, const std::optional<std::map<std::string, std::string>>& env) {
        return read_settings(env_or_process(env), arguments);
      },
      py::arg("arguments") = Arguments{}, py::arg("env") = py::none(),
      "init()'s timeout/backend/log_dir beat DTCORE_* variables, which beat the defaults; ConfigError lists bad "
      "values");

  m.def(
      "configure_logging",
      [](int rank, int world_size, const std::string& host, const Settings& settings) {
        return log::configure(log_config(settings, rank, world_size, host));
      },
      py::arg("rank"), py::arg("world_size"), py::arg("host"), py::arg("settings"),
      "Sets this rank's console level and log file; returns the file's path, or ''");
  m.def("log", [](int level, const std::string& message) {
    log::write(static_cast<log::Level>(std::clamp(level, 0, 3)), message);
  });
  m.def("log_enabled", [](int level) { return log::enabled(static_cast<log::Level>(std::clamp(level, 0, 3))); });
  m.def("flush_logs", &log::flush);
}

}  // namespace dtcore::bindings
