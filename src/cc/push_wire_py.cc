// Python bindings of push_wire_cpu.h: `push_encode`, `push_decode`, `scan_ids`. The Python layer
// (elasticdl/common/push_wire.py, elasticdl/ops/id_scan.py) normalises the arrays and keeps
// the reference implementation these must match.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "push_wire_cpu.h"

namespace py = pybind11;

namespace edl::wire {
namespace {

std::vector<int64_t> dims_of(py::handle shape) {
  std::vector<int64_t> dims;
  for (auto d : shape) dims.push_back(d.cast<int64_t>());
  return dims;
}

TensorOut tensor_of(py::handle dtype, py::handle shape, py::handle data) {
  auto array = py::reinterpret_borrow<py::array>(data);
  if (!py::isinstance<py::array>(data) || !(array.flags() & py::array::c_style))
    throw py::value_error("push_encode: tensors must be C-contiguous NumPy arrays");
  TensorOut t;
  t.dtype = dtype.cast<int64_t>();
  t.dims = dims_of(shape);
  for (int64_t d : t.dims)
    if (d < 0) throw py::value_error("push_encode: negative dimension");
  t.data = static_cast<const char*>(array.data());
  t.nbytes = static_cast<int64_t>(array.nbytes());
  return t;
}

// (name bytes, dtype, dims, array[, dtype, dims, array]) tuples -> entries.
std::vector<EntryOut> entries_of(const py::list& items, bool tables) {
  std::vector<EntryOut> out;
  out.reserve(items.size());
  for (auto item : items) {
    auto t = item.cast<py::tuple>();
    if (t.size() != (tables ? 7u : 4u)) throw py::value_error("push_encode: malformed entry");
    EntryOut e;
    e.name = t[0].cast<std::string>();
    e.values = tensor_of(t[1], t[2], t[3]);
    if (tables) e.indices = tensor_of(t[4], t[5], t[6]);
    out.push_back(std::move(e));
  }
  return out;
}

py::tuple dims_tuple(const std::vector<int64_t>& dims) {
  py::tuple t(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) t[i] = py::int_(dims[i]);
  return t;
}

}  // namespace

void bind(py::module_& m) {
  m.def(
      "push_encode",
      [](py::bytes head, const py::list& dense, const py::list& tables) {
        const auto d = entries_of(dense, false);
        const auto t = entries_of(tables, true);
        char* head_data;
        Py_ssize_t head_size;
        PyBytes_AsStringAndSize(head.ptr(), &head_data, &head_size);
        const int64_t size = push_size(head_size, d, t);
        auto out = py::reinterpret_steal<py::bytes>(PyBytes_FromStringAndSize(nullptr, size));
        if (!out) throw py::error_already_set();
        char* dst = PyBytes_AS_STRING(out.ptr());
        {
          py::gil_scoped_release nogil;
          write_push(head_data, head_size, d, t, dst);
        }
        return out;
      },
      "A serialized request `head` followed by one gradients field of the dense entries (name, dtype, dims, "
      "array) and the table entries (name, values dtype, dims, array, indices dtype, dims, array).");

  m.def(
      "push_decode",
      [](py::buffer data, int64_t string_dtype) -> py::object {
        py::buffer_info info = data.request();
        DecodedLayout layout;
        if (info.itemsize != 1 || info.ndim != 1 ||
            !read_push(static_cast<const uint8_t*>(info.ptr), info.size, string_dtype, &layout))
          return py::none();
        const char* bytes = static_cast<const char*>(info.ptr);
        auto name = [&](const EntrySpan& e) -> py::object {
          PyObject* s = PyUnicode_DecodeUTF8(bytes + e.name_start, e.name_end - e.name_start, "strict");
          if (!s) throw py::error_already_set();
          return py::reinterpret_steal<py::object>(s);
        };
        py::list tables, dense;
        try {
          for (const auto& e : layout.tables)
            tables.append(py::make_tuple(name(e), e.values.dtype, dims_tuple(e.values.dims), e.values.start,
                                         e.values.end, e.indices.dtype, dims_tuple(e.indices.dims),
                                         e.indices.start, e.indices.end));
          for (const auto& e : layout.dense)
            dense.append(
                py::make_tuple(name(e), e.values.dtype, dims_tuple(e.values.dims), e.values.start, e.values.end));
        } catch (py::error_already_set& err) {
          if (!err.matches(PyExc_UnicodeDecodeError)) throw;
          return py::none();  // a name that is not UTF-8: Python reads the request
        }
        return py::make_tuple(py::bytes(layout.request), tables, dense);
      },
      "(request bytes, tables, dense) of a push as push_wire reads it, or None where it would not.");

  m.def(
      "scan_ids",
      [](py::array_t<int64_t, py::array::c_style | py::array::forcecast> ids, int64_t num_ps, int64_t ps_id) {
        if (num_ps <= 0) throw py::value_error("scan_ids: num_ps must be > 0");
        const int64_t* p = ids.data();
        const int64_t n = ids.size();
        IdScan s;
        {
          py::gil_scoped_release nogil;
          s = scan_ids(p, n, num_ps, ps_id);
        }
        return py::make_tuple(s.min, s.first_foreign, s.increasing);
      },
      "(smallest id, index of the first id another PS owns or -1, strictly increasing) in one pass.");
}

}  // namespace edl::wire
