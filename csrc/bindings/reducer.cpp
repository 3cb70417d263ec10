// dtcore._C bindings of csrc/dtcore/reducer: the reducer and its options. Bindings only, no logic.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "dtcore/reducer/reducer.h"

namespace py = pybind11;

namespace dtcore::bindings {

void bind_reducer(py::module_& m) {
  using Options = Reducer::Options;
  const Options defaults;  // the defaults are Options' own (reducer.h), here and in dtcore.wrap's signature
  py::class_<Options>(m, "ReducerOptions")
      .def(py::init([](double bucket_mb, double first_bucket_mb, bool find_unused_parameters,
                       std::optional<at::ScalarType> comm_dtype) {
             return Options{bucket_mb, first_bucket_mb, find_unused_parameters, comm_dtype};
           }),
           py::arg("bucket_mb") = defaults.bucket_mb, py::arg("first_bucket_mb") = defaults.first_bucket_mb,
           py::arg("find_unused_parameters") = defaults.find_unused_parameters, py::arg("comm_dtype") = py::none())
      .def_readwrite("bucket_mb", &Options::bucket_mb)
      .def_readwrite("first_bucket_mb", &Options::first_bucket_mb)
      .def_readwrite("find_unused_parameters", &Options::find_unused_parameters)
      .def_readwrite("comm_dtype", &Options::comm_dtype);

  py::class_<Reducer, std::shared_ptr<Reducer>>(m, "Reducer")
      .def(py::init([](std::vector<at::Tensor> params, std::vector<std::string> names,
                       std::shared_ptr<Communicator> comm, Options options) {
             auto r = std::make_shared<Reducer>(std::move(params), std::move(names), std::move(comm), options);
             r->set_rethrow(&rethrow_as_python_error);  // `except dtcore.CommError` around backward()
             return r;
           }),
           py::arg("params"), py::arg("names"), py::arg("communicator"), py::arg("options") = defaults)
      .def("find_unused", &Reducer::find_unused, py::arg("outputs"), py::call_guard<py::gil_scoped_release>())
      .def("prepare_for_backward", &Reducer::prepare_for_backward, py::arg("sync") = true,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("reductions", &Reducer::reductions)
      .def("bucket_params", [](const Reducer& r) {
        std::vector<std::vector<size_t>> out;
        for (const auto& b : r.buckets()) out.push_back(b.params);
        return out;
      });
}

}  // namespace dtcore::bindings
