// dtcore._C bindings of csrc/dtcore/reducer: the reducer and its options. Bindings only, no logic.
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/python_comm_hook.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "bindings/bindings.h"
#include "dtcore/reducer/reducer.h"

namespace py = pybind11;

namespace dtcore::bindings {

void bind_reducer(py::module_& m) {
  using Options = Reducer::Options;
  const Options defaults;  // the defaults are Options' own (reducer.h), here and in dtcore.wrap's signature
  py::class_<Options>(m, "ReducerOptions")
      .def(py::init([](double bucket_mb, double first_bucket_mb, bool find_unused_parameters,
                       std::optional<at::ScalarType> comm_dtype, int zero, bool static_graph,
                       bool skip_all_reduce_unused_params, bool auto_buckets) {
             return Options{bucket_mb, first_bucket_mb, find_unused_parameters,        comm_dtype,
                            zero,      static_graph,    skip_all_reduce_unused_params, auto_buckets};
           }),
           py::arg("bucket_mb") = defaults.bucket_mb, py::arg("first_bucket_mb") = defaults.first_bucket_mb,
           py::arg("find_unused_parameters") = defaults.find_unused_parameters, py::arg("comm_dtype") = py::none(),
           py::arg("zero") = defaults.zero, py::arg("static_graph") = defaults.static_graph,
           py::arg("skip_all_reduce_unused_params") = defaults.skip_all_reduce_unused_params,
           py::arg("auto_buckets") = defaults.auto_buckets)
      .def_readwrite("bucket_mb", &Options::bucket_mb)
      .def_readwrite("first_bucket_mb", &Options::first_bucket_mb)
      .def_readwrite("find_unused_parameters", &Options::find_unused_parameters)
      .def_readwrite("comm_dtype", &Options::comm_dtype)
      .def_readwrite("zero", &Options::zero)
      .def_readwrite("static_graph", &Options::static_graph)
      .def_readwrite("skip_all_reduce_unused_params", &Options::skip_all_reduce_unused_params)
      .def_readwrite("auto_buckets", &Options::auto_buckets)
      .def("check", &Reducer::check_options);

  py::class_<ShardPiece>(m, "ShardPiece")
      .def_readonly("param", &ShardPiece::param)
      .def_readonly("param_offset", &ShardPiece::param_offset)
      .def_readonly("shard_offset", &ShardPiece::shard_offset)
      .def_readonly("numel", &ShardPiece::numel);
  py::class_<BucketShard>(m, "BucketShard")
      .def_readonly("padded_numel", &BucketShard::padded_numel)
      .def_readonly("shard_numel", &BucketShard::shard_numel)
      .def_readonly("begin", &BucketShard::begin)
      .def_readonly("pieces", &BucketShard::pieces);

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
      .def_property("find_unused_parameters", &Reducer::find_unused_parameters, &Reducer::set_find_unused_parameters)
      .def("set_static_graph", &Reducer::set_static_graph)
      .def_property_readonly("static_graph", &Reducer::static_graph)
      .def_property_readonly("static_graph_recorded", &Reducer::static_graph_recorded)
      .def_property_readonly("last_buckets_reduced", &Reducer::last_buckets_reduced)
      .def_property_readonly("order_rebuilt", &Reducer::order_rebuilt)
      .def_property_readonly("backward_errors", [](const Reducer& r) { return r.last_backward_error().count; })
      .def("last_backward_error",
           [](const Reducer& r) {  // (count, class name, message)
             auto e = r.last_backward_error();
             return std::make_tuple(e.count, e.kind, e.message);
           })
      .def(
          "register_comm_hook",
          [](Reducer& r, py::object state, py::object hook) {
            // torch's own adapter: the hook gets a torch.distributed.GradBucket and returns a torch Future.
            r.register_comm_hook(std::make_unique<c10d::PythonCommHook>(std::move(state), std::move(hook)));
          },
          py::arg("state"), py::arg("hook"))
      .def(
          "install_post_backward_futures",
          [](Reducer& r, const py::list& futures) {
            std::vector<HookFuture> out;
            // torch._C.Future: what a Work's get_future() gives; torch.futures.Future derives from it.
            const py::object future_type = py::module_::import("torch._C").attr("Future");
            for (const auto& f : futures) {
              if (!py::isinstance(f, future_type)) {
                out.emplace_back();  // refused by the reducer, with the fix
                continue;
              }
              out.push_back(torch::jit::toIValue(f, c10::FutureType::create(c10::AnyType::get())).toFuture());
            }
            r.install_post_backward_futures(std::move(out));
          },
          py::arg("futures"))
      .def("set_divisor", &Reducer::set_divisor, py::arg("ranks"))
      .def("check_joinable", &Reducer::check_joinable)
      .def("release_parameters", &Reducer::release_parameters)
      .def("shadow_backward", &Reducer::shadow_backward, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("reductions", &Reducer::reductions)
      .def("last_backward_times",
           [](const Reducer& r) {  // (comm start, compute end, comm end); See Note [Backward timeline]
             const auto t = r.last_backward_times();
             return std::make_tuple(t.comm_start_ns, t.compute_end_ns, t.comm_end_ns);
           })
      .def("last_ready_order", &Reducer::last_ready_order)
      .def("auto_plan_info",
           [](const Reducer& r) {
             const Reducer::AutoPlanInfo i = r.auto_plan_info();
             py::dict d;
             d["chosen"] = i.chosen;
             d["device_clock"] = i.device_clock;
             d["alpha_us"] = i.alpha_us;
             d["us_per_mib"] = i.us_per_mib;
             d["backward_ms"] = i.backward_ms;
             d["exposed_ms"] = i.exposed_ms;
             d["default_exposed_ms"] = i.default_exposed_ms;
             return d;
           })
      .def("adopt_plan", &Reducer::adopt_plan, py::arg("buckets"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("zero", &Reducer::zero)
      .def_property_readonly("plan_final", &Reducer::plan_final)
      .def_property_readonly("plan_version", &Reducer::plan_version)
      .def("shards", &Reducer::shards)
      .def("grad_shards", &Reducer::grad_shards)
      .def("zero_grad", &Reducer::zero_grad, py::arg("set_to_none") = true, py::call_guard<py::gil_scoped_release>())
      .def("params_without_grad", &Reducer::params_without_grad)
      .def("bucket_params",
           [](const Reducer& r) {
             std::vector<std::vector<size_t>> out;
             for (const auto& b : r.buckets()) out.push_back(b.params);
             return out;
           })
      .def("bucket_layout", [](const Reducer& r) {  // per bucket: (param index, offset, numel) in layout order
        std::vector<std::vector<std::tuple<size_t, int64_t, int64_t>>> out;
        for (const auto& b : r.buckets()) {
          auto& entries = out.emplace_back();
          for (size_t k = 0; k < b.params.size(); ++k) entries.emplace_back(b.params[k], b.offsets[k], b.numels[k]);
        }
        return out;
      });
}

}  // namespace dtcore::bindings
