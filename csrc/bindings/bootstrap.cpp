// dtcore._C bindings of csrc/dtcore/bootstrap: the world spec, its validation, the backend choice
// and the rendezvous. Bindings only, no logic.
#include <pybind11/stl.h>

#include <unistd.h>

#include "bindings/bindings.h"
#include "dtcore/bootstrap/accelerate.h"
#include "dtcore/bootstrap/backend.h"
#include "dtcore/bootstrap/launcher.h"
#include "dtcore/bootstrap/rendezvous.h"
#include "dtcore/bootstrap/roster.h"
#include "dtcore/bootstrap/validate.h"

namespace py = pybind11;

namespace dtcore::bindings {
namespace {

WorldCheckOptions check_options(const std::string& backend, int visible_gpus, const std::string& host, bool resolve) {
  WorldCheckOptions o;
  o.backend = backend;
  o.visible_gpus = visible_gpus;
  o.host = host;
  o.resolve_master = resolve;
  return o;
}

}  // namespace

void bind_bootstrap(py::module_& m) {
  // See Note [World fields]: the eight properties, FIELDS and `sources` come from one list.
  py::class_<WorldSpec> spec(m, "WorldSpec");
  spec.def(py::init<const WorldSpec&>(), py::arg("other"), "A copy (dtcore.Context derives from WorldSpec)");
  py::tuple names(0);
#define DTCORE_BIND_FIELD(type, name, knob)                                           \
  spec.def_property_readonly(#name, [](const WorldSpec& s) { return s.name.value; }); \
  names = names + py::make_tuple(#name);
  DTCORE_WORLD_FIELDS(DTCORE_BIND_FIELD)
#undef DTCORE_BIND_FIELD
  spec.attr("FIELDS") = names;
  spec.def_property_readonly("sources",
                             [](const WorldSpec& s) {
                               std::map<std::string, std::string> out;
#define DTCORE_SOURCE(type, name, knob) out[#name] = s.name.source;
                               DTCORE_WORLD_FIELDS(DTCORE_SOURCE)
#undef DTCORE_SOURCE
                               return out;
                             })
      .def_property_readonly("launcher", [](const WorldSpec& s) { return std::string(launcher_name(s.launcher)); })
      .def_readonly("use_agent_store", &WorldSpec::use_agent_store)
      .def_readonly("restart_count", &WorldSpec::restart_count)
      .def_readonly("cuda_visible_devices", &WorldSpec::cuda_visible_devices)
      .def_property_readonly("job_id", [](const WorldSpec& s) { return s.job_id.value; })
      .def_property_readonly("job_id_source", [](const WorldSpec& s) { return s.job_id.source; })
      .def("describe", &WorldSpec::describe)
      .def("__repr__", [](const WorldSpec& s) { return "WorldSpec(" + s.describe() + ")"; });

  m.def(
      "read_world",
      [](const std::optional<std::map<std::string, std::string>>& env, const Arguments& overrides) {
        return read_world(env_or_process(env), parse_overrides(overrides));
      },
      py::arg("env") = py::none(), py::arg("overrides") = Arguments{},
      "The job's shape from a launcher's environment; init() arguments (`overrides`) beat DTCORE_* beat launcher");

  m.def(
      "validate_overrides", [](const Arguments& overrides) { parse_overrides(overrides); }, py::arg("overrides"),
      "ConfigError for an init() argument with an unknown name or a value of the wrong type");

  py::class_<Problem> problem(m, "Problem");
  fields<Access::kRead>(problem, "field", &Problem::field, "variable", &Problem::variable, "value", &Problem::value,
                        "message", &Problem::message, "fix", &Problem::fix);
  problem.def("label", &Problem::label).def("__str__", &Problem::to_string);
  m.def(
      "check_world",
      [](const WorldSpec& s, const std::string& backend, int visible_gpus, const std::string& host, bool resolve) {
        return check_world(s, check_options(backend, visible_gpus, host, resolve));
      },
      py::arg("spec"), py::arg("backend"), py::arg("visible_gpus") = -1, py::arg("host") = "",
      py::arg("resolve_master") = true);
  m.def(
      "validate_world",
      [](const WorldSpec& s, const std::string& backend, int visible_gpus, const std::string& host, bool resolve) {
        validate_world(s, check_options(backend, visible_gpus, host, resolve));
      },
      py::arg("spec"), py::arg("backend"), py::arg("visible_gpus") = -1, py::arg("host") = "",
      py::arg("resolve_master") = true);
  m.def("cuda_device_index", &cuda_device_index, py::arg("spec"), py::arg("visible_gpus"));

  m.def(
      "choose_backend",
      [](const Settings& settings, int cuda_devices, const std::string& torch_version, const WorldSpec& spec) {
        return *choose_backend(settings.backend, BackendFacts{cuda_devices, torch_version, spec.cuda_visible_devices});
      },
      py::arg("settings"), py::arg("cuda_devices"), py::arg("torch_version"), py::arg("spec"),
      "'nccl' or 'gloo' for the settings' backend; ConfigError naming its source when it cannot be honoured");

  m.def(
      "accelerate_started_fewer",
      [](const WorldSpec& spec, const std::string& config_path, const std::string& config_text) {
        return accelerate_started_fewer(Env::from_process(), spec, config_path, parse_accelerate_config(config_text));
      },
      py::arg("spec"), py::arg("config_path") = "", py::arg("config_text") = "",
      "'' unless accelerate started this process alone although asked for more; else the warning with its fix");

  py::class_<RosterEntry> entry(m, "RosterEntry");
  fields<Access::kRead>(entry, "rank", &RosterEntry::rank, "host", &RosterEntry::host, "pid", &RosterEntry::pid,
                        "local_rank", &RosterEntry::local_rank, "device", &RosterEntry::device, "device_id",
                        &RosterEntry::device_id, "fingerprint", &RosterEntry::fingerprint);

  py::class_<Rendezvous>(m, "Rendezvous")
      .def_property_readonly("store", &Rendezvous::store)
      .def_property_readonly("port", &Rendezvous::port)
      .def_property_readonly("spec", &Rendezvous::spec)
      .def("close", &Rendezvous::close, py::call_guard<py::gil_scoped_release>())
      .def("roster", &Rendezvous::roster, py::call_guard<py::gil_scoped_release>());
  m.def(
      "rendezvous",
      [](const WorldSpec& spec, const Settings& settings, const std::string& host, const std::string& device,
         std::map<std::string, std::string> fingerprint, int generation, const std::string& device_id,
         c10::intrusive_ptr<c10d::Store> store) {
        auto self = RosterEntry::for_process(spec, host, device, std::move(fingerprint), device_id);
        auto options = RendezvousOptions::from(settings, generation);
        const Env env = Env::from_process();  // as read_world() without env=: this process's
        py::gil_scoped_release release;
        return Rendezvous::join(spec, std::move(self), options, env, std::move(store));
      },
      py::arg("spec"), py::arg("settings"), py::arg("host"), py::arg("device"), py::arg("fingerprint"),
      py::arg("generation") = 0, py::arg("device_id") = "", py::arg("store") = py::none(),
      "Blocks until every rank has joined and agreed, or raises RendezvousError; with `store`, on that store");
}

}  // namespace dtcore::bindings
