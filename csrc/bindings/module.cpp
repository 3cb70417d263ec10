// dtcore._C: bindings only, no logic. Blocking calls release the GIL.
//
// Built with torch's bundled pybind11 (see CMakeLists.txt) so that at::Tensor, c10d::Store and
// c10d::Backend objects cross between torch._C and this module as the same Python types.
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <cmath>

#include <unistd.h>

#include "bindings/bindings.h"
#include "dtcore/bootstrap/launcher.h"
#include "dtcore/bootstrap/rendezvous.h"
#include "dtcore/bootstrap/validate.h"
#include "dtcore/comm/gloo_communicator.h"
#include "dtcore/comm/health.h"
#include "dtcore/comm/nccl_communicator.h"
#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/log.h"
#include "dtcore/reducer/reducer.h"

namespace py = pybind11;
using namespace dtcore;

namespace {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// A timeout from Python: positive, and never rounded down to 0 ms (which c10d reads as "forever").
std::chrono::milliseconds timeout_ms(double seconds, const char* what) {
  DTCORE_CHECK(seconds > 0 && std::isfinite(seconds), ConfigError, what, "=", seconds,
               " is not a positive number of seconds. Fix: pass e.g. 300.");
  return std::max(std::chrono::milliseconds(1), to_ms(seconds));
}

Env env_from(const std::optional<std::map<std::string, std::string>>& vars) {
  if (!vars) return Env::from_process();
  return Env(std::map<std::string, std::string, std::less<>>(vars->begin(), vars->end()));
}

WorldOverrides overrides_from(const py::dict& d) {
  static const char* kKeys[] = {"rank",     "world_size",  "local_rank",  "local_world_size",
                                "node_rank", "num_nodes", "master_addr", "master_port"};
  WorldOverrides o;
  for (auto item : d) {
    std::string key = py::str(item.first);
    if (item.second.is_none()) continue;
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    DTCORE_CHECK(known, ConfigError, "init() got an unknown argument '", key,
                 "'. Fix: use one of rank, world_size, local_rank, local_world_size, node_rank, num_nodes, "
                 "master_addr, master_port.");
    if (key == "master_addr") {
      o.master_addr = py::cast<std::string>(item.second);
      continue;
    }
    DTCORE_CHECK(py::isinstance<py::int_>(item.second) && !py::isinstance<py::bool_>(item.second), ConfigError,
                 "init(", key, "=", std::string(py::repr(item.second)), ") must be an integer.");
    int v = py::cast<int>(item.second);
    if (key == "rank") o.rank = v;
    else if (key == "world_size") o.world_size = v;
    else if (key == "local_rank") o.local_rank = v;
    else if (key == "local_world_size") o.local_world_size = v;
    else if (key == "node_rank") o.node_rank = v;
    else if (key == "num_nodes") o.num_nodes = v;
    else if (key == "master_port") o.master_port = v;
  }
  return o;
}

WorldCheckOptions check_options(const std::string& backend, int visible_gpus, const std::string& host,
                                bool resolve_master) {
  WorldCheckOptions o;
  o.backend = backend;
  o.visible_gpus = visible_gpus;
  o.host = host;
  o.resolve_master = resolve_master;
  return o;
}

py::dict roster_entry_dict(const RosterEntry& e) {
  py::dict d;
  d["rank"] = e.rank;
  d["host"] = e.host;
  d["pid"] = e.pid;
  d["local_rank"] = e.local_rank;
  d["device"] = e.device;
  d["fingerprint"] = e.fingerprint;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dtcore's C++ core: bootstrap, rendezvous, communicators, logging";
  m.attr("__version__") = DTCORE_VERSION;
  m.attr("built_torch_version") = DTCORE_TORCH_VERSION;
#if defined(DTCORE_WITH_NCCL)
  m.attr("has_nccl") = true;
#else
  m.attr("has_nccl") = false;
#endif
  m.def("nccl_version", &nccl_runtime_version, "NCCL's runtime version, or '' without NCCL");

  // Errors: the base first, so that the more specific translators (registered later) are tried first.
  auto& base = py::register_exception<Error>(m, "DtcoreError", PyExc_RuntimeError);
  py::register_exception<ConfigError>(m, "ConfigError", base.ptr());
  py::register_exception<RendezvousError>(m, "RendezvousError", base.ptr());
  py::register_exception<CommError>(m, "CommError", base.ptr());
  py::register_exception<CheckpointError>(m, "CheckpointError", base.ptr());

  bindings::bind_check(m);       // resource checker probes
  bindings::bind_activation(m);  // activation-checkpoint planner

  // Knobs.
  m.def("knobs", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (const Knob& k : knobs()) out.emplace_back(k.name, k.default_value, k.doc);
    return out;
  });
  m.def("knob_value", [](const std::string& name, std::optional<std::map<std::string, std::string>> env) {
    return knob_value(env_from(env), name);
  }, py::arg("name"), py::arg("env") = py::none());
  m.def("knob_seconds", [](const std::string& name, std::optional<std::map<std::string, std::string>> env) {
    return knob_seconds(env_from(env), name);
  }, py::arg("name"), py::arg("env") = py::none());

  // Logging.
  m.def("configure_logging",
        [](int rank, int world_size, const std::string& host, const std::string& console_level,
           const std::string& log_dir, const std::string& level_source) {
          log::Config c;
          c.rank = rank;
          c.world_size = world_size;
          c.host = host;
          c.console_level = log::parse_level(console_level, level_source);
          c.log_dir = log_dir;
          return log::configure(c);
        },
        py::arg("rank"), py::arg("world_size"), py::arg("host"), py::arg("console_level"), py::arg("log_dir"),
        py::arg("level_source") = "console level");
  m.def("log", [](int level, const std::string& message) {
    log::write(static_cast<log::Level>(std::clamp(level, 0, 3)), message);
  });
  m.def("log_enabled", [](int level) { return log::enabled(static_cast<log::Level>(std::clamp(level, 0, 3))); });
  m.def("flush_logs", &log::flush);

  // World spec.
  py::class_<WorldSpec>(m, "WorldSpec")
      .def_property_readonly("launcher", [](const WorldSpec& s) { return std::string(launcher_name(s.launcher)); })
      .def_property_readonly("rank", [](const WorldSpec& s) { return s.rank.value; })
      .def_property_readonly("world_size", [](const WorldSpec& s) { return s.world_size.value; })
      .def_property_readonly("local_rank", [](const WorldSpec& s) { return s.local_rank.value; })
      .def_property_readonly("local_world_size", [](const WorldSpec& s) { return s.local_world_size.value; })
      .def_property_readonly("node_rank", [](const WorldSpec& s) { return s.node_rank.value; })
      .def_property_readonly("num_nodes", [](const WorldSpec& s) { return s.num_nodes.value; })
      .def_property_readonly("master_addr", [](const WorldSpec& s) { return s.master_addr.value; })
      .def_property_readonly("master_port", [](const WorldSpec& s) { return s.master_port.value; })
      .def_readonly("use_agent_store", &WorldSpec::use_agent_store)
      .def_readonly("restart_count", &WorldSpec::restart_count)
      .def_property_readonly("sources", [](const WorldSpec& s) { return dtcore::bindings::world_fields(s, true); })
      .def("describe", &WorldSpec::describe)
      .def("__repr__", [](const WorldSpec& s) { return "WorldSpec(" + s.describe() + ")"; });

  m.def("read_world",
        [](std::optional<std::map<std::string, std::string>> env, const py::dict& overrides) {
          return read_world(env_from(env), overrides_from(overrides));
        },
        py::arg("env") = py::none(), py::arg("overrides") = py::dict());

  py::class_<Problem>(m, "Problem")
      .def_readonly("variable", &Problem::variable)
      .def_readonly("value", &Problem::value)
      .def_readonly("message", &Problem::message)
      .def_readonly("fix", &Problem::fix)
      .def("__str__", &Problem::to_string);
  m.def("check_world",
        [](const WorldSpec& s, const std::string& backend, int visible_gpus, const std::string& host, bool resolve) {
          return check_world(s, check_options(backend, visible_gpus, host, resolve));
        },
        py::arg("spec"), py::arg("backend"), py::arg("visible_gpus") = -1, py::arg("host") = "",
        py::arg("resolve_master") = true);
  m.def("validate_world",
        [](const WorldSpec& s, const std::string& backend, int visible_gpus, const std::string& host, bool resolve) {
          validate_world(s, check_options(backend, visible_gpus, host, resolve));
        },
        py::arg("spec"), py::arg("backend"), py::arg("visible_gpus") = -1, py::arg("host") = "",
        py::arg("resolve_master") = true);

  // Rendezvous.
  py::class_<Rendezvous>(m, "Rendezvous")
      .def_property_readonly("store", &Rendezvous::store)
      .def_property_readonly("port", &Rendezvous::port)
      .def_property_readonly("uses_libuv", &Rendezvous::uses_libuv)
      .def("close", [](Rendezvous& r) {
        py::gil_scoped_release release;
        r.close();
      })
      .def("roster", [](Rendezvous& r) {
        std::vector<RosterEntry> entries;
        {
          py::gil_scoped_release release;
          entries = r.roster();
        }
        py::list out;
        for (const auto& e : entries) out.append(roster_entry_dict(e));
        return out;
      });
  m.def("rendezvous",
        [](const WorldSpec& spec, const std::string& host, const std::string& device,
           const std::map<std::string, std::string>& fingerprint, double timeout_s, double log_interval_s,
           const std::string& libuv, int generation) {
          RosterEntry self;
          self.host = host;
          self.pid = static_cast<long>(getpid());
          self.local_rank = spec.local_rank.value;
          self.device = device;
          self.fingerprint = fingerprint;
          RendezvousOptions o;
          o.timeout = timeout_ms(timeout_s, "timeout");
          o.log_interval = timeout_ms(log_interval_s, "log_interval_s");
          o.libuv = libuv;
          o.generation = generation;
          py::gil_scoped_release release;
          return Rendezvous::join(spec, std::move(self), o);
        },
        py::arg("spec"), py::arg("host"), py::arg("device"), py::arg("fingerprint"), py::arg("timeout_s"),
        py::arg("log_interval_s") = 5.0, py::arg("libuv") = "auto", py::arg("generation") = 0);
  m.def("cuda_device_index", &cuda_device_index, py::arg("spec"), py::arg("visible_gpus"));

  // Communicators.
  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", [](Work& w, double timeout_s) {
        auto timeout = timeout_ms(timeout_s, "timeout");
        py::gil_scoped_release release;
        w.wait(timeout);
      }, py::arg("timeout_s"))
      .def("is_completed", &Work::is_completed, py::call_guard<py::gil_scoped_release>());

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("backend", [](const Communicator& c) { return std::string(c.backend()); })
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("timeout_s", [](const Communicator& c) { return c.timeout().count() / 1000.0; })
      .def("all_reduce", [](Communicator& c, const at::Tensor& t, const std::string& op) {
        ReduceOp rop = parse_reduce_op(op);
        py::gil_scoped_release release;
        return c.allreduce(t, rop);
      }, py::arg("tensor"), py::arg("op") = "sum")
      .def("reduce_scatter", [](Communicator& c, const at::Tensor& out, const at::Tensor& in, const std::string& op) {
        ReduceOp rop = parse_reduce_op(op);
        py::gil_scoped_release release;
        return c.reduce_scatter(out, in, rop);
      }, py::arg("output"), py::arg("input"), py::arg("op") = "sum")
      .def("all_gather", [](Communicator& c, const at::Tensor& out, const at::Tensor& in) {
        py::gil_scoped_release release;
        return c.all_gather(out, in);
      }, py::arg("output"), py::arg("input"))
      .def("broadcast", [](Communicator& c, const at::Tensor& t, int src) {
        py::gil_scoped_release release;
        return c.broadcast(t, src);
      }, py::arg("tensor"), py::arg("src") = 0)
      .def("barrier", [](Communicator& c) {
        py::gil_scoped_release release;
        return c.barrier();
      })
      .def("set_health", &Communicator::set_health, py::arg("health"))
      .def("close", [](Communicator& c) {
        py::gil_scoped_release release;
        c.close();
      });

  py::class_<HealthMonitor, std::shared_ptr<HealthMonitor>>(m, "HealthMonitor")
      .def_property_readonly("interval_s", [](const HealthMonitor& h) { return h.interval().count() / 1000.0; })
      .def("close", [](HealthMonitor& h) {
        py::gil_scoped_release release;
        h.close();
      })
      .def("diagnose", [](HealthMonitor& h, uint64_t seq, const std::string& op) {
        py::gil_scoped_release release;
        return h.diagnose(seq, op);
      }, py::arg("failing_seq"), py::arg("op_name") = "collective");
  m.def("health_monitor", [](Rendezvous& r, double interval_s) {
    auto interval = timeout_ms(interval_s, "DTCORE_HEARTBEAT_INTERVAL");
    py::gil_scoped_release release;
    return HealthMonitor::for_rendezvous(r, interval);
  }, py::arg("rendezvous"), py::arg("interval_s"));

  // Reducer (internal until dtcore.wrap is complete).
  py::class_<Reducer, std::shared_ptr<Reducer>>(m, "Reducer")
      .def(py::init([](std::vector<at::Tensor> params, std::vector<std::string> names,
                       std::shared_ptr<Communicator> comm, double bucket_mb, double first_bucket_mb,
                       bool find_unused_parameters, std::optional<at::ScalarType> comm_dtype) {
             Reducer::Options o;
             o.caps = BucketCaps{megabytes_to_bytes(bucket_mb, "bucket_mb"),
                                 megabytes_to_bytes(first_bucket_mb, "first_bucket_mb")};
             o.find_unused_parameters = find_unused_parameters;
             o.comm_dtype = comm_dtype;
             return std::make_shared<Reducer>(std::move(params), std::move(names), std::move(comm), o);
           }),
           py::arg("params"), py::arg("names"), py::arg("communicator"), py::arg("bucket_mb") = 25.0,
           py::arg("first_bucket_mb") = 1.0, py::arg("find_unused_parameters") = false,
           py::arg("comm_dtype") = py::none())
      .def("find_unused", &Reducer::find_unused, py::arg("outputs"), py::call_guard<py::gil_scoped_release>())
      .def("prepare_for_backward", &Reducer::prepare_for_backward, py::arg("sync") = true,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("reductions", &Reducer::reductions)
      .def("bucket_params", [](const Reducer& r) {
        std::vector<std::vector<size_t>> out;
        for (const auto& b : r.buckets()) out.push_back(b.params);
        return out;
      });

  m.def("gloo_communicator",
        [](const c10::intrusive_ptr<c10d::Backend>& backend, double timeout_s) -> std::shared_ptr<Communicator> {
          return std::make_shared<GlooCommunicator>(backend, timeout_ms(timeout_s, "timeout"));
        },
        py::arg("backend"), py::arg("timeout_s"));
#if defined(DTCORE_WITH_NCCL)
  m.def("nccl_communicator",
        [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int device,
           double timeout_s) -> std::shared_ptr<Communicator> {
          auto timeout = timeout_ms(timeout_s, "timeout");
          py::gil_scoped_release release;
          return std::make_shared<NcclCommunicator>(store, rank, size, device, timeout);
        },
        py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("device"), py::arg("timeout_s"));
#endif
}
