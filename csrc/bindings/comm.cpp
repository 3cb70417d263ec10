// dtcore._C bindings of csrc/dtcore/comm: work handles, communicators and the health monitor.
// Bindings only, no logic. Blocking calls release the GIL.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "dtcore/bootstrap/backend.h"
#include "dtcore/comm/gloo_communicator.h"
#include "dtcore/comm/health.h"
#include "dtcore/comm/nccl_communicator.h"
#include "dtcore/common/units.h"

namespace py = pybind11;

namespace dtcore::bindings {

void bind_comm(py::module_& m) {
  m.attr("has_nccl") = built_with_nccl();
  m.def("nccl_version", &nccl_runtime_version, "NCCL's runtime version, or '' without NCCL");
  m.def("wait_seconds", &wait_seconds,
        "Seconds the calling thread has spent blocked waiting for collectives (Work.wait, and the "
        "reducer's waits inside backward), since it started");

  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def(
          "wait",
          [](Work& w, std::optional<double> timeout_s) {
            auto timeout = timeout_s ? std::optional(seconds_to_timeout(*timeout_s, "timeout")) : std::nullopt;
            py::gil_scoped_release release;
            timeout ? w.wait(*timeout) : w.wait();
          },
          py::arg("timeout_s") = py::none(),
          "Blocks until done; CommError on failure or after the timeout "
          "(the communicator's, unless given)")
      .def("wait_on_stream", &Work::wait_on_stream, py::call_guard<py::gil_scoped_release>(),
           "On NCCL: the current CUDA stream waits for the collective, and this returns at once (a "
           "failure found later aborts the communicator and its next collective raises); elsewhere "
           "the same as wait()")
      .def("is_completed", &Work::is_completed, py::call_guard<py::gil_scoped_release>());

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("backend", [](const Communicator& c) { return std::string(c.backend()); })
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("ranks", &Communicator::job_ranks,
                             "The members' job ranks, by rank in this communicator (a subgroup's rank list)")
      .def_property_readonly("timeout_s", [](const Communicator& c) { return c.timeout().count() / 1000.0; })
      .def_property_readonly(
          "engine",
          [](Communicator& c) -> py::object {
            auto* gloo = dynamic_cast<GlooCommunicator*>(&c);
            auto engine = gloo ? gloo->engine() : nullptr;
            return engine ? py::cast(engine) : py::none();
          },
          "The torch.distributed.ProcessGroupGloo a Gloo communicator drives; None with NCCL or once closed")
      .def_property_readonly(
          "shared_memory",
          [](Communicator& c) {
            auto* gloo = dynamic_cast<GlooCommunicator*>(&c);
            return gloo != nullptr && gloo->shared_memory();
          },
          "Whether a Gloo communicator's ranks exchange through shared memory (DTCORE_SHM)")
      .def(
          "shared_buffer",
          [](Communicator& c, int64_t nbytes) -> py::object {
            at::Tensor t;
            {
              py::gil_scoped_release release;
              t = c.shared_buffer(nbytes);
            }
            return t.defined() ? py::cast(t) : py::none();
          },
          py::arg("nbytes"),
          "A collective: nbytes of zeroed memory (a uint8 tensor) that every rank maps, where an all_reduce "
          "runs in place with no copy (the reducer keeps its buckets there); None where there is none (NCCL, "
          "several hosts, no shared memory, a full /dev/shm)")
      .def(
          "all_reduce",
          [](Communicator& c, const at::Tensor& t, const std::string& op) {
            ReduceOp rop = parse_reduce_op(op);
            py::gil_scoped_release release;
            return c.all_reduce(t, rop);
          },
          py::arg("tensor"), py::arg("op") = "sum")
      .def(
          "reduce_scatter",
          [](Communicator& c, const at::Tensor& out, const at::Tensor& in, const std::string& op) {
            ReduceOp rop = parse_reduce_op(op);
            py::gil_scoped_release release;
            return c.reduce_scatter(out, in, rop);
          },
          py::arg("output"), py::arg("input"), py::arg("op") = "sum")
      .def("all_gather", &Communicator::all_gather, py::arg("output"), py::arg("input"), py::arg("label") = "",
           py::call_guard<py::gil_scoped_release>())
      .def("broadcast", &Communicator::broadcast, py::arg("tensor"), py::arg("src") = 0, py::arg("label") = "",
           py::call_guard<py::gil_scoped_release>())
      .def("barrier", &Communicator::barrier, py::arg("label") = "", py::call_guard<py::gil_scoped_release>())
      .def("set_health", &Communicator::set_health, py::arg("health"))
      .def("set_flight_dump", &Communicator::set_flight_dump, py::arg("path"), py::arg("host"))
      .def(
          "dump_flight_record", [](Communicator& c, const std::string& why) { return c.recorder()->dump(why); },
          py::arg("why"), py::call_guard<py::gil_scoped_release>(),
          "Writes the flight record to its dump file now; returns the path ('' when none is set)")
      .def("close", &Communicator::close, py::call_guard<py::gil_scoped_release>());

  py::class_<HealthMonitor, std::shared_ptr<HealthMonitor>>(m, "HealthMonitor")
      .def_property_readonly("interval_s", [](const HealthMonitor& h) { return h.interval().count() / 1000.0; })
      .def("close", &HealthMonitor::close, py::call_guard<py::gil_scoped_release>())
      .def("diagnose", &HealthMonitor::diagnose, py::arg("failing_seq"), py::arg("op_name") = "collective",
           py::call_guard<py::gil_scoped_release>());
  m.def("health_monitor", &HealthMonitor::for_rendezvous, py::arg("rendezvous"), py::arg("settings"),
        py::arg("ranks") = std::vector<int>{}, py::arg("prefix") = "", py::call_guard<py::gil_scoped_release>());

  m.def(
      "gloo_communicator",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const Settings& settings,
         std::vector<int> ranks) -> std::shared_ptr<Communicator> {
        auto options = CommunicatorOptions::from(settings);
        options.ranks = std::move(ranks);
        py::gil_scoped_release release;  // the ranks agree on shared memory through Gloo
        return std::make_shared<GlooCommunicator>(backend, options);
      },
      py::arg("backend"), py::arg("settings"), py::arg("ranks") = std::vector<int>{});
#if defined(DTCORE_WITH_NCCL)
  m.def(
      "nccl_communicator",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int device, const Settings& settings,
         std::vector<int> ranks) -> std::shared_ptr<Communicator> {
        auto options = CommunicatorOptions::from(settings);
        options.ranks = std::move(ranks);
        py::gil_scoped_release release;
        return std::make_shared<NcclCommunicator>(store, rank, size, device, options);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("device"), py::arg("settings"),
      py::arg("ranks") = std::vector<int>{});
#endif
}

}  // namespace dtcore::bindings
