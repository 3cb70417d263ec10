// dtcore._C bindings of csrc/dtcore/checkpoint: atomic files, safetensors writing and copy plans
// (tensors become TensorEntry views of their memory; the GIL is released while writing); and two
// walks of Python objects for in-memory checkpoints, which take one at every step (so they live
// with the bindings): encode_json, values.py's conversion of Python values into JSON text (its
// format is values.py's), and TensorWatch, memory.py's check that the state is where it was.
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/autograd/python_variable.h>

#include <pybind11/stl.h>

#include <charconv>
#include <cmath>
#include <vector>

#include "bindings/bindings.h"
#include "dtcore/checkpoint/atomic_file.h"
#include "dtcore/checkpoint/copy_plan.h"
#include "dtcore/checkpoint/safetensors.h"
#include "dtcore/common/error.h"

namespace py = pybind11;

namespace dtcore::bindings {

namespace {

// encode_json: python/dtcore/checkpoint/values.py's encoding of a Python value, as JSON text. The walk over
// containers and plain values is here, for in-memory checkpoints encode their record at every step (a
// Python walk cost tens of microseconds there); the leaves it does not know (NumPy's, torch.dtype, and the
// error for what cannot be held) go to values.py's `other`, which gives their JSON text.
class ValueEncoder {
 public:
  // `tensors`: a list, or None (nothing appended: a check only). `exact`: every value of exactly a type the walk
  // knows, or handed to `other` (which refuses what would come back as its base type).
  ValueEncoder(py::object tensors, py::object other, py::object tags, bool exact)
      : tensors_(std::move(tensors)), other_(std::move(other)), tags_(std::move(tags)), exact_(exact) {
    DTCORE_CHECK(PyFrozenSet_Check(tags_.ptr()), ConfigError, "encode_json: tags must be a frozenset (a dtcore bug).");
  }

  std::string encode(py::handle value, const std::string& where) {
    where_ = where;
    write(value.ptr());
    return std::move(out_);
  }

 private:
  // A step of the path from the top value to the one being written, made text only when a tensor's key or
  // an error needs it (values.py's names: `where[0]`, `where['key']`, `where.key`).
  struct Step {
    enum Kind { kIndex, kKey, kItemKey } kind;
    Py_ssize_t index = 0;
    PyObject* key = nullptr;  // borrowed from the walk's own snapshot of the dict's items, alive below it
  };
  static constexpr std::size_t kMaxDepth = 500;

  std::string where() const {
    std::string text = where_;
    for (const Step& step : path_) {
      if (step.kind == Step::kIndex) {
        text += "[" + std::to_string(step.index) + "]";
      } else if (step.kind == Step::kItemKey) {
        text += ".key";
      } else {
        text += "[" + py::repr(step.key).cast<std::string>() + "]";
      }
    }
    return text;
  }

  // Whether `value`'s type is exactly one the walk writes (not a subclass, which comes back as its base).
  static bool exactly_known(PyObject* value) {
    return value == Py_None || PyBool_Check(value) || PyLong_CheckExact(value) || PyFloat_CheckExact(value) ||
           PyUnicode_CheckExact(value) || PyList_CheckExact(value) || PyTuple_CheckExact(value) ||
           PyDict_CheckExact(value) || Py_TYPE(value) == reinterpret_cast<PyTypeObject*>(THPVariableClass);
  }

  void write(PyObject* value) {
    if (exact_ && !exactly_known(value)) {
      write_other(value);
    } else if (value == Py_None) {
      out_ += "null";
    } else if (PyBool_Check(value)) {
      out_ += value == Py_True ? "true" : "false";
    } else if (PyLong_Check(value)) {
      write_int(value);
    } else if (PyFloat_Check(value)) {
      write_float(PyFloat_AS_DOUBLE(value));
    } else if (PyUnicode_Check(value)) {
      write_string(value);
    } else if (THPVariable_Check(value) && plain_tensor(THPVariable_Unpack(value))) {
      const std::string key = where();
      if (!tensors_.is_none()) {
        at::Tensor tensor = THPVariable_Unpack(value).detach().to(at::kCPU).contiguous();
        py::tuple entry = py::make_tuple(key, py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(tensor))));
        if (PyList_Append(tensors_.ptr(), entry.ptr()) != 0) throw py::error_already_set();
      }
      out_ += "{\"__tensor__\": ";
      write_text(key);
      out_ += "}";
    } else if (PyList_Check(value) || PyTuple_Check(value)) {
      write_sequence(value);
    } else if (PyDict_Check(value)) {
      write_dict(value);
    } else {
      write_other(value);
    }
  }

  // A tensor whose values are its own, on a device: not a meta tensor, nor a subclass whose operations run Python
  // (DTensor's, a __torch_dispatch__ one), whose bytes a CopyPlan could not copy without the GIL; other's to
  // refuse.
  static bool plain_tensor(const at::Tensor& t) {
    return !t.is_meta() && !t.unsafeGetTensorImpl()->is_python_dispatch();
  }

  void write_int(PyObject* value) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow == 0 && !(v == -1 && PyErr_Occurred())) {
      char buffer[24];
      out_.append(buffer, std::to_chars(buffer, buffer + sizeof(buffer), v).ptr);
      return;
    }
    PyErr_Clear();
    PyObject* digits = PyLong_Type.tp_repr(value);  // int's own (NULL past sys.get_int_max_str_digits())
    if (digits == nullptr) throw py::error_already_set();
    out_ += py::reinterpret_steal<py::object>(digits).cast<std::string>();
  }

  void write_float(double v) {  // as Python's json module: float.__repr__, and its names for the rest
    if (std::isnan(v)) {
      out_ += "NaN";
    } else if (std::isinf(v)) {
      out_ += v > 0 ? "Infinity" : "-Infinity";
    } else {
      char* text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);
      if (text == nullptr) throw py::error_already_set();
      out_ += text;
      PyMem_Free(text);
    }
  }

  void write_string(PyObject* value) {  // as Python's json module with ensure_ascii: escapes outside ' '..'~'
    if (PyUnicode_READY(value) != 0) throw py::error_already_set();
    const int kind = PyUnicode_KIND(value);
    const void* data = PyUnicode_DATA(value);
    const Py_ssize_t length = PyUnicode_GET_LENGTH(value);
    out_ += '"';
    for (Py_ssize_t i = 0; i < length; ++i) write_code_point(PyUnicode_READ(kind, data, i));
    out_ += '"';
  }

  void write_text(const std::string& text) {  // a key made here (ASCII but for a key's repr)
    write_string(py::str(text).ptr());
  }

  void write_code_point(Py_UCS4 c) {
    static constexpr char kHex[] = "0123456789abcdef";
    switch (c) {
      case '"': out_ += "\\\""; return;
      case '\\': out_ += "\\\\"; return;
      case '\n': out_ += "\\n"; return;
      case '\r': out_ += "\\r"; return;
      case '\t': out_ += "\\t"; return;
      case '\b': out_ += "\\b"; return;
      case '\f': out_ += "\\f"; return;
      default: break;
    }
    if (c >= ' ' && c <= '~') {
      out_ += static_cast<char>(c);
      return;
    }
    if (c > 0xFFFF) {  // a surrogate pair, as JSON writes what is beyond 16 bits
      c -= 0x10000;
      write_code_point(0xD800 | ((c >> 10) & 0x3FF));
      write_code_point(0xDC00 | (c & 0x3FF));
      return;
    }
    out_ += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out_ += kHex[(c >> shift) & 0xF];
  }

  void descend() {
    DTCORE_CHECK(path_.size() < kMaxDepth, CheckpointError, where(), " is nested more than ", kMaxDepth,
                 " deep (a value that holds itself?). Fix: save plain values there.");
  }

  void write_sequence(PyObject* value) {
    descend();
    const bool tuple = PyTuple_Check(value);
    // A tuple of the items, as iterating gives them (a subclass's own order): the walk's own references, whatever
    // a callback (a key's repr, values.py's leaves) does to the list.
    py::object items = py::reinterpret_steal<py::object>(PySequence_Tuple(value));
    if (!items) throw py::error_already_set();
    out_ += tuple ? "{\"__tuple__\": [" : "[";
    const Py_ssize_t size = PyTuple_GET_SIZE(items.ptr());
    for (Py_ssize_t i = 0; i < size; ++i) {
      if (i > 0) out_ += ", ";
      path_.push_back({Step::kIndex, i});
      write(PyTuple_GET_ITEM(items.ptr(), i));
      path_.pop_back();
    }
    out_ += tuple ? "]}" : "]";
  }

  bool is_tag(PyObject* key) const {  // one of values.py's TAGS
    const int found = PySet_Contains(tags_.ptr(), key);
    if (found < 0) throw py::error_already_set();
    return found == 1;
  }

  void write_dict(PyObject* value) {
    descend();
    // Its items, as items() gives them (a subclass's own order: an OrderedDict moved around), in a list of the
    // walk's own, whatever a callback does to the dict.
    py::object items = py::reinterpret_steal<py::object>(PyMapping_Items(value));
    if (!items) throw py::error_already_set();
    bool plain = true;  // every key a str, none of them a tag
    for (py::handle pair : items) {
      PyObject* key = PyTuple_GET_ITEM(pair.ptr(), 0);
      if (!PyUnicode_Check(key) || is_tag(key)) {
        plain = false;
        break;
      }
    }
    out_ += plain ? "{" : "{\"__items__\": [";
    bool first = true;
    for (py::handle pair : items) {
      PyObject* key = PyTuple_GET_ITEM(pair.ptr(), 0);
      PyObject* item = PyTuple_GET_ITEM(pair.ptr(), 1);
      if (!first) out_ += ", ";
      first = false;
      if (plain) {
        write_string(key);
        out_ += ": ";
      } else {
        out_ += "[";
        path_.push_back({Step::kItemKey});
        write(key);
        path_.pop_back();
        out_ += ", ";
      }
      path_.push_back({Step::kKey, 0, key});
      write(item);
      path_.pop_back();
      if (!plain) out_ += "]";
    }
    out_ += plain ? "}" : "]}";
  }

  void write_other(PyObject* value) {  // values.py's leaves: it gives their JSON text
    py::object text = other_(py::handle(value), tensors_, where());
    DTCORE_CHECK(PyUnicode_Check(text.ptr()), CheckpointError, "values.py's encoding of ", where(), " gave a ",
                 Py_TYPE(text.ptr())->tp_name, " (a dtcore bug: it gives JSON text).");
    out_ += text.cast<std::string>();
  }

  py::object tensors_;
  py::object other_;
  py::object tags_;
  bool exact_;
  std::string where_;
  std::vector<Step> path_;
  std::string out_;
};

// TensorWatch: whether tensors are still where a layout found them (memory.py's _Watch, at every save): each
// (table, name) entry still the very object (a tensor: at the same address too), each table (a module's
// _parameters, _buffers or _modules, an optimizer state's entry) of the same size, and each name that held None
// still without a value.
class TensorWatch {
 public:
  TensorWatch(const py::list& tables, const py::list& owners, const py::list& names, const py::list& tensors,
              const py::list& empty_owners, const py::list& empty_names) {
    DTCORE_CHECK(
        owners.size() == names.size() && names.size() == tensors.size() && empty_owners.size() == empty_names.size(),
        ConfigError, "TensorWatch: lists of different lengths (a dtcore bug).");
    for (py::handle table : tables) tables_.emplace_back(dict(table), PyDict_Size(table.ptr()));
    for (std::size_t i = 0; i < owners.size(); ++i) {
      entries_.push_back({dict(owners[i]), py::reinterpret_borrow<py::object>(names[i]),
                          py::reinterpret_borrow<py::object>(tensors[i]), address(tensors[i].ptr())});
    }
    for (std::size_t i = 0; i < empty_owners.size(); ++i) {
      empty_.emplace_back(dict(empty_owners[i]), py::reinterpret_borrow<py::object>(empty_names[i]));
    }
  }

  bool same() const {
    for (const auto& [table, size] : tables_) {
      if (PyDict_Size(table.ptr()) != size) return false;
    }
    for (const Entry& entry : entries_) {
      if (lookup(entry.owner, entry.name) != entry.tensor.ptr() || address(entry.tensor.ptr()) != entry.address) {
        return false;
      }
    }
    for (const auto& [owner, name] : empty_) {
      PyObject* found = lookup(owner, name);
      if (found != nullptr && found != Py_None) return false;
    }
    return true;
  }

 private:
  static py::object dict(py::handle table) {
    DTCORE_CHECK(PyDict_Check(table.ptr()), ConfigError, "TensorWatch: a table that is not a dict (a dtcore bug).");
    return py::reinterpret_borrow<py::object>(table);
  }
  static PyObject* lookup(const py::object& owner, const py::object& name) {  // borrowed; nullptr: absent
    PyObject* found = PyDict_GetItemWithError(owner.ptr(), name.ptr());
    if (found == nullptr && PyErr_Occurred()) throw py::error_already_set();
    return found;
  }
  static const void* address(PyObject* tensor) {  // as Tensor.data_ptr(), 0 without storage (or not a tensor)
    if (!THPVariable_Check(tensor)) return nullptr;
    const at::Tensor& t = THPVariable_Unpack(tensor);
    return t.has_storage() ? t.const_data_ptr() : nullptr;
  }

  struct Entry {
    py::object owner, name, tensor;
    const void* address;
  };
  std::vector<std::pair<py::object, Py_ssize_t>> tables_;
  std::vector<Entry> entries_;
  std::vector<std::pair<py::object, py::object>> empty_;
};

}  // namespace

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
  m.def(
      "encode_json",
      [](py::handle value, py::object tensors, const std::string& where, py::object other, py::object tags,
         bool exact) {
        DTCORE_CHECK(tensors.is_none() || PyList_Check(tensors.ptr()), ConfigError,
                     "encode_json: tensors must be a list or None (a dtcore bug).");
        return ValueEncoder(std::move(tensors), std::move(other), std::move(tags), exact).encode(value, where);
      },
      py::arg("value"), py::arg("tensors"), py::arg("where"), py::arg("other"), py::arg("tags"),
      py::arg("exact") = false,
      "values.py's encoding of `value` as JSON text; its tensors appended to `tensors` (a list, or None) as (key, CPU "
      "tensor); a dict with a key in `tags` (a frozenset) is written as __items__; with `exact`, every value not "
      "of exactly a known type goes to `other`; "
      "`other(value, tensors, where)` gives the JSON text of what is not a container, tensor or plain value");
  py::class_<TensorWatch>(m, "TensorWatch")
      .def(py::init<const py::list&, const py::list&, const py::list&, const py::list&, const py::list&,
                    const py::list&>(),
           py::arg("tables"), py::arg("owners"), py::arg("names"), py::arg("tensors"), py::arg("empty_owners"),
           py::arg("empty_names"))
      .def("same", &TensorWatch::same,
           "Whether every table has its size, every (owner, name) its tensor at its address, and every empty name "
           "no tensor");
  using checkpoint::CopyPlan;
  py::class_<CopyPlan>(m, "CopyPlan")
      .def(py::init<std::vector<at::Tensor>, std::vector<at::Tensor>>(), py::arg("destinations"), py::arg("sources"))
      .def("run", &CopyPlan::run, py::arg("tail"), py::call_guard<py::gil_scoped_release>(),
           "Copies every source into its destination, then `tail` into the destinations left")
      .def_property_readonly("tail_size", &CopyPlan::tail_size)
      .def_property_readonly("bytes", &CopyPlan::bytes);
  m.def("digest_file", &checkpoint::digest_file, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
        "Size and SHA-256 of a file (CheckpointError naming it when it cannot be read)");
}

}  // namespace dtcore::bindings
