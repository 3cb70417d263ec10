// dtcore._C bindings of csrc/dtcore/checkpoint: atomic files and safetensors writing. Bindings
// only: tensors become TensorEntry views of their memory; the GIL is released while writing.
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "dtcore/checkpoint/atomic_file.h"
#include "dtcore/checkpoint/safetensors.h"
#include "dtcore/common/error.h"

namespace py = pybind11;

namespace dtcore::bindings {

void bind_checkpoint(py::module_& m) {
  using checkpoint::FileDigest;
  py::class_<FileDigest>(m, "FileDigest")
      .def_readonly("bytes", &FileDigest::bytes)
      .def_readonly("sha256", &FileDigest::sha256)
      .def("__repr__", [](const FileDigest& d) {
        return "FileDigest(bytes=" + std::to_string(d.bytes) + ", sha256='" + d.sha256 + "')";
      });

  m.def(
      "write_safetensors",
      [](const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
         const std::map<std::string, std::string>& metadata) {
        std::vector<checkpoint::TensorEntry> entries;
        entries.reserve(tensors.size());
        for (const auto& [name, t] : tensors) {
          DTCORE_CHECK(t.device().is_cpu() && t.is_contiguous(), CheckpointError, "checkpoint tensor '", name,
                       "' must be a contiguous CPU tensor to be written (a dtcore bug: it is staged first).");
          entries.push_back({name, checkpoint::safetensors_dtype(t.scalar_type()), t.sizes().vec(),
                             static_cast<const std::uint8_t*>(t.data_ptr()), t.nbytes()});
        }
        py::gil_scoped_release release;  // the tensors stay alive: the caller's list holds them
        return checkpoint::write_safetensors(path, entries, metadata);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata"),
      "Writes (name, contiguous CPU tensor) pairs as one safetensors file, atomically; returns its FileDigest");
  m.def(
      "write_file_atomic",
      [](const std::string& path, const std::string& data) {
        py::gil_scoped_release release;
        return checkpoint::write_file_atomic(path, data);
      },
      py::arg("path"), py::arg("data"), "Writes `data` to `path` through a temporary name, fsync and rename");
  m.def("digest_file", &checkpoint::digest_file, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
        "Size and SHA-256 of a file (CheckpointError naming it when it cannot be read)");
}

}  // namespace dtcore::bindings
