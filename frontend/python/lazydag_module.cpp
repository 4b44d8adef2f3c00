// The Python module `lazydag`: NDArray and its operators, devices, waits and
// engine statistics, with NumPy interop (asnumpy, __array__, the buffer
// protocol, DLPack, nd.array of a NumPy array), the profiler and sync
// debugging. Every blocking call (waits, item, asnumpy, the exports,
// printing) names its Python caller for sync debugging and releases the
// GIL; running nodes never need it (they run C++ kernels), so a Python
// thread blocked in a wait never stops the engine.
#include <lazydag/engine/profiler.hpp>
#include <lazydag/engine/sync_debug.hpp>
#include <lazydag/dist.hpp>
#include <lazydag/lazydag.hpp>

#include "config.hpp"
#include "training.hpp"

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace lazydag;

namespace lazydag_py {

// NumPy dtype (or its name, or a Python type) -> DType.
DType to_dtype(const py::object& o) {
  const std::string name = py::str(py::module_::import("numpy").attr("dtype")(o).attr("name"));
  if (name == "float32") return DType::kFloat32;
  if (name == "float64") return DType::kFloat64;
  if (name == "int32") return DType::kInt32;
  if (name == "int64") return DType::kInt64;
  if (name == "bool") return DType::kBool;
  throw InvalidArgument("dtype " + name + " is not supported (float32, float64, int32, int64, bool)");
}

DType dtype_or(const py::object& o, DType fallback) { return o.is_none() ? fallback : to_dtype(o); }
Device device_or(const py::object& o) { return o.is_none() ? default_device() : o.cast<Device>(); }

}  // namespace lazydag_py

using lazydag_py::device_or;
using lazydag_py::dtype_or;
using lazydag_py::to_dtype;

namespace {

Shape to_shape(const py::object& o) {
  if (py::isinstance<py::int_>(o)) return Shape{o.cast<std::int64_t>()};
  return o.cast<Shape>();
}

py::tuple shape_tuple(const Shape& s) {
  py::tuple t(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) t[i] = s[i];
  return t;
}

// The Python caller of a blocking call, for sync debugging: its file, line
// and function, read from the current frame (only while sync debugging is
// on). The GIL must be held.
class PythonSite {
 public:
  PythonSite() {
    if (engine::sync_debug() == engine::SyncDebug::kOff) return;
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed; null outside Python code
    if (frame == nullptr) return;
    const int line = PyFrame_GetLineNumber(frame);
    py::object code = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(PyFrame_GetCode(frame)));
    site_.emplace(py::str(code.attr("co_filename")).cast<std::string>(), static_cast<std::uint32_t>(line),
                  py::str(code.attr("co_name")).cast<std::string>());
  }

 private:
  std::optional<engine::ForeignCallSite> site_;
};

// The engine's window stalls a recording thread inside push (it helps run
// recorded work until the frontend is back within the window): the GIL is
// released there too, so other Python threads run meanwhile.
thread_local PyThreadState* tls_stalled = nullptr;
void stall_enter() {
  if (PyGILState_Check() != 0) tls_stalled = PyEval_SaveThread();
}
void stall_leave() {
  if (tls_stalled != nullptr) {
    PyEval_RestoreThread(tls_stalled);
    tls_stalled = nullptr;
  }
}

// Around every blocking call: names the Python caller (GIL held), then
// releases the GIL for the wait; the GIL comes back before the site goes.
class Blocking {
  PythonSite site_;
  py::gil_scoped_release nogil_;
};

// A NumPy array holding a copy of `a` (blocks: a wait to read, GIL released).
py::array asnumpy(const NDArray& a) {
  const Shape shape = a.shape();
  auto fill = [&]<class T>(py::array_t<T> out) {
    std::vector<T> v;
    {
      Blocking nogil;
      v = a.to_vector<T>();
    }
    if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(T));
    return py::array(out);
  };
  switch (a.dtype()) {
    case DType::kFloat32: return fill(py::array_t<float>(shape));
    case DType::kFloat64: return fill(py::array_t<double>(shape));
    case DType::kInt32: return fill(py::array_t<std::int32_t>(shape));
    case DType::kInt64: return fill(py::array_t<std::int64_t>(shape));
    case DType::kBool: {
      std::vector<bool> v;
      {
        Blocking nogil;
        v = a.to_vector<bool>();
      }
      py::array_t<bool> out(shape);
      bool* p = out.mutable_data();
      for (std::size_t i = 0; i < v.size(); ++i) p[i] = v[i];
      return out;
    }
  }
  throw InvalidArgument("asnumpy: unknown dtype");
}

// The buffer protocol: a CPU array's memory without a copy (NumPy's asarray
// and memoryview use it). An implicit blocker with the GIL released: a
// read-only export waits to read; a writable one (asked for with
// PyBUF_WRITABLE) waits to write and counts as an in-place write. The view
// holds this Python object, hence the storage; arrays on sim or gpu are
// refused (copyto(cpu()) first).
PyObject* g_invalid_argument = nullptr;  // lazydag.InvalidArgument

struct BufferExport {
  HostBuffer memory;
  std::string format;
  std::vector<Py_ssize_t> shape;
  std::vector<Py_ssize_t> strides;  // bytes
};

extern "C" int get_buffer(PyObject* obj, Py_buffer* view, int flags) {
  if (view == nullptr) {
    PyErr_SetString(PyExc_BufferError, "lazydag.NDArray: no Py_buffer to fill");
    return -1;
  }
  const bool writable = (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE;
  auto e = std::make_unique<BufferExport>();
  try {
    const auto& a = py::handle(obj).cast<const NDArray&>();
    {
      Blocking nogil;
      e->memory = a.host_buffer(writable);
    }
  } catch (py::error_already_set& err) {
    err.restore();
    return -1;
  } catch (const InvalidArgument& x) {
    PyErr_SetString(g_invalid_argument != nullptr ? g_invalid_argument : PyExc_BufferError, x.what());
    return -1;
  } catch (const std::exception& x) {
    PyErr_SetString(PyExc_BufferError, x.what());
    return -1;
  }
  const HostBuffer& b = e->memory;
  const auto item = static_cast<Py_ssize_t>(size_of(b.dtype));
  switch (b.dtype) {
    case DType::kFloat32: e->format = py::format_descriptor<float>::format(); break;
    case DType::kFloat64: e->format = py::format_descriptor<double>::format(); break;
    case DType::kInt32: e->format = py::format_descriptor<std::int32_t>::format(); break;
    case DType::kInt64: e->format = py::format_descriptor<std::int64_t>::format(); break;
    case DType::kBool: e->format = py::format_descriptor<bool>::format(); break;
  }
  Py_ssize_t count = 1;
  bool contiguous = true;
  Py_ssize_t expected = item;
  for (std::size_t d = b.shape.size(); d-- > 0;) {
    count *= static_cast<Py_ssize_t>(b.shape[d]);
    if (b.shape[d] != 1 && static_cast<Py_ssize_t>(b.strides[d]) * item != expected) contiguous = false;
    expected *= static_cast<Py_ssize_t>(b.shape[d]);
  }
  if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !contiguous) {
    PyErr_SetString(PyExc_BufferError, "lazydag.NDArray: this view is not C-contiguous; ask for strides");
    return -1;
  }
  for (std::size_t d = 0; d < b.shape.size(); ++d) {
    e->shape.push_back(static_cast<Py_ssize_t>(b.shape[d]));
    e->strides.push_back(static_cast<Py_ssize_t>(b.strides[d]) * item);
  }
  view->obj = obj;
  Py_INCREF(obj);
  view->buf = b.data;
  view->len = count * item;
  view->readonly = writable ? 0 : 1;
  view->itemsize = item;
  view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT ? e->format.data() : nullptr;
  view->ndim = static_cast<int>(b.shape.size());
  view->shape = (flags & PyBUF_ND) == PyBUF_ND ? e->shape.data() : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? e->strides.data() : nullptr;
  view->suboffsets = nullptr;
  view->internal = e.release();
  return 0;
}

extern "C" void release_buffer(PyObject*, Py_buffer* view) { delete static_cast<BufferExport*>(view->internal); }

// DLPack 0.6 (__dlpack__ / __dlpack_device__): a CPU array's memory to any
// DLPack consumer (numpy.from_dlpack, torch.from_dlpack) without a copy.
// DLPack has no read-only flag, so the export waits to write and counts as
// an in-place write; the capsule holds the storage until the consumer's
// deleter (or the unconsumed capsule's destructor) lets it go.
struct DlpackExport {
  HostBuffer memory;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // elements
  DLManagedTensor managed{};
};

void dlpack_deleter(DLManagedTensor* t) { delete static_cast<DlpackExport*>(t->manager_ctx); }

py::capsule to_dlpack(const NDArray& a, const py::object& stream) {
  if (!stream.is_none()) {
    throw InvalidArgument("__dlpack__: stream must be None for a CPU array (got " +
                          std::string(py::str(stream)) + ")");
  }
  DLDataType type{};
  type.lanes = 1;
  switch (a.dtype()) {
    case DType::kFloat32: type = {kDLFloat, 32, 1}; break;
    case DType::kFloat64: type = {kDLFloat, 64, 1}; break;
    case DType::kInt32: type = {kDLInt, 32, 1}; break;
    case DType::kInt64: type = {kDLInt, 64, 1}; break;
    case DType::kBool:
      throw InvalidArgument("__dlpack__: DLPack 0.6 has no bool type; export a.astype('int32') or use the "
                            "buffer protocol (np.asarray(a))");
  }
  auto e = std::make_unique<DlpackExport>();
  {
    Blocking nogil;
    e->memory = a.host_buffer(/*writable=*/true);
  }
  e->shape.assign(e->memory.shape.begin(), e->memory.shape.end());
  e->strides.assign(e->memory.strides.begin(), e->memory.strides.end());
  DLTensor& t = e->managed.dl_tensor;
  t.data = e->memory.data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<std::int32_t>(e->shape.size());
  t.dtype = type;
  t.shape = e->shape.data();
  t.strides = e->strides.data();
  t.byte_offset = 0;
  e->managed.manager_ctx = e.get();
  e->managed.deleter = &dlpack_deleter;
  DLManagedTensor* managed = &e->managed;
  // A capsule nobody consumed (still named "dltensor") frees the export.
  py::capsule capsule(managed, "dltensor", [](PyObject* c) {
    if (PyCapsule_IsValid(c, "dltensor") != 0) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
      m->deleter(m);
    }
  });
  e.release();
  return capsule;
}

// nd.array: from a NumPy array (or anything numpy.asarray takes).
NDArray from_numpy(const py::object& obj, const py::object& dtype, const py::object& device) {
  py::module_ np = py::module_::import("numpy");
  py::object arr = np.attr("asarray")(obj);
  DType t = dtype.is_none() ? DType::kFloat32 : to_dtype(dtype);
  if (dtype.is_none()) {
    // keep what NumPy says, with float64 -> float64 and Python ints -> int64
    const std::string kind = py::str(arr.attr("dtype").attr("kind"));
    if (kind == "b") {
      t = DType::kBool;
    } else if (kind == "f") {
      t = to_dtype(arr.attr("dtype"));
    } else if (kind == "i" || kind == "u") {
      t = py::int_(arr.attr("dtype").attr("itemsize")).cast<int>() <= 4 ? DType::kInt32 : DType::kInt64;
    } else {
      throw InvalidArgument("nd.array: cannot convert NumPy dtype " + std::string(py::str(arr.attr("dtype"))));
    }
  }
  py::array c = np.attr("ascontiguousarray")(arr, std::string(to_string(t)));
  Shape shape(static_cast<std::size_t>(c.ndim()));
  for (py::ssize_t i = 0; i < c.ndim(); ++i) shape[static_cast<std::size_t>(i)] = c.shape(i);
  return detail::make_array(c.data(), static_cast<std::size_t>(c.size()), t, shape, device_or(device));
}

NDArray reduce(const NDArray& a, const py::object& axis, bool keepdims,
               NDArray (NDArray::*all)() const, NDArray (NDArray::*along)(int, bool) const) {
  if (axis.is_none()) {
    NDArray r = (a.*all)();
    return keepdims ? r.reshape(Shape(static_cast<std::size_t>(a.ndim()), 1)) : r;
  }
  return (a.*along)(axis.cast<int>(), keepdims);
}

std::string repr(const NDArray& a) {
  std::ostringstream os;
  {
    Blocking nogil;
    os << a;
  }
  return os.str();
}

// Operators test their right operand's type by hand, one binding each:
// pybind11's overload resolution tries every overload in two passes, and
// for a Python number it first looks up a foreign-module attribute on it
// (an AttributeError formatted and dropped), which cost about as much as
// recording the op itself. A Python float or int takes the fast path; other
// numbers (NumPy scalars) go through float(); anything else is
// NotImplemented, so Python tries the reflected operator.
enum class Operand : std::uint8_t { kArray, kNumber, kOther };

Operand classify(py::handle b, double& number) {
  PyObject* o = b.ptr();
  if (PyFloat_Check(o) || PyLong_Check(o)) {
    number = PyFloat_AsDouble(o);
    if (number == -1.0 && PyErr_Occurred()) throw py::error_already_set();  // an int too large
    return Operand::kNumber;
  }
  if (py::isinstance<NDArray>(b)) return Operand::kArray;
  if (PyNumber_Check(o) != 0 && PySequence_Check(o) == 0) {  // not a NumPy array
    number = PyFloat_AsDouble(o);
    if (!(number == -1.0 && PyErr_Occurred())) return Operand::kNumber;
    PyErr_Clear();
  }
  return Operand::kOther;
}

py::object not_implemented() { return py::reinterpret_borrow<py::object>(Py_NotImplemented); }

// a OP b for an array or a number b.
template <class ArrayOp, class NumberOp>
py::object binary_operator(const NDArray& a, py::handle b, ArrayOp with_array, NumberOp with_number) {
  double number = 0;
  switch (classify(b, number)) {
    case Operand::kArray: return py::cast(with_array(a, b.cast<const NDArray&>()));
    case Operand::kNumber: return py::cast(with_number(a, number));
    case Operand::kOther: break;
  }
  return not_implemented();
}

// b OP a for a number b (the reflected operators).
template <class NumberOp>
py::object reflected_operator(const NDArray& a, py::handle b, NumberOp with_number) {
  double number = 0;
  if (classify(b, number) != Operand::kNumber) return not_implemented();
  return py::cast(with_number(number, a));
}

// a OP= b: the write is recorded on a's buffer and `self` is returned.
template <class ArrayOp, class NumberOp>
py::object inplace_operator(const py::object& self, py::handle b, ArrayOp with_array, NumberOp with_number) {
  NDArray& a = self.cast<NDArray&>();
  double number = 0;
  switch (classify(b, number)) {
    case Operand::kArray: with_array(a, b.cast<const NDArray&>()); return self;
    case Operand::kNumber: with_number(a, number); return self;
    case Operand::kOther: break;
  }
  return not_implemented();
}

template <class Class>
void def_operators(Class& arr) {
#define LAZYDAG_BINARY(name, op)                                                                    \
  arr.def(name, [](const NDArray& a, py::handle b) {                                                \
    return binary_operator(a, b, [](const NDArray& x, const NDArray& y) { return x op y; },          \
                           [](const NDArray& x, double y) { return x op y; });                      \
  }, py::is_operator())
#define LAZYDAG_REFLECTED(name, op)                                                                 \
  arr.def(name, [](const NDArray& a, py::handle b) {                                                \
    return reflected_operator(a, b, [](double x, const NDArray& y) { return x op y; });             \
  }, py::is_operator())
#define LAZYDAG_INPLACE(name, op)                                                                   \
  arr.def(name, [](const py::object& self, py::handle b) {                                          \
    return inplace_operator(self, b, [](NDArray& x, const NDArray& y) { x op y; },                  \
                            [](NDArray& x, double y) { x op y; });                                  \
  }, py::is_operator())
  LAZYDAG_BINARY("__add__", +); LAZYDAG_BINARY("__sub__", -);
  LAZYDAG_BINARY("__mul__", *); LAZYDAG_BINARY("__truediv__", /);
  LAZYDAG_REFLECTED("__radd__", +); LAZYDAG_REFLECTED("__rsub__", -);
  LAZYDAG_REFLECTED("__rmul__", *); LAZYDAG_REFLECTED("__rtruediv__", /);
  LAZYDAG_INPLACE("__iadd__", +=); LAZYDAG_INPLACE("__isub__", -=);
  LAZYDAG_INPLACE("__imul__", *=); LAZYDAG_INPLACE("__itruediv__", /=);
  LAZYDAG_BINARY("__lt__", <); LAZYDAG_BINARY("__le__", <=);
  LAZYDAG_BINARY("__gt__", >); LAZYDAG_BINARY("__ge__", >=);
  LAZYDAG_BINARY("__eq__", ==); LAZYDAG_BINARY("__ne__", !=);
#undef LAZYDAG_BINARY
#undef LAZYDAG_REFLECTED
#undef LAZYDAG_INPLACE
  arr.def("__pow__", [](const NDArray& a, py::handle b) {
    return binary_operator(a, b, [](const NDArray& x, const NDArray& y) { return nd::pow(x, y); },
                           [](const NDArray& x, double y) { return nd::pow(x, y); });
  }, py::is_operator());
}

// The arithmetic operators' number slots, on the type itself. pybind11
// reaches a bound __add__ through the type's generic slot: a method lookup,
// its dispatcher and argument casters, and a result cast that looks the
// type up by name (hashing it) for every op: about 40% of a recorded
// `y = y + 1` from Python. These slots take the common cases (array with
// array, array with a number as the bound methods take it, either side) with the type
// object and its pybind11 record looked up once; every other operand, and
// any error, goes to the bound methods above, which give the same results
// and the same exceptions. Ops refuse bad
// input before recording anything, so a case retried there records once.
PyTypeObject* g_array_type = nullptr;
const py::detail::type_info* g_array_info = nullptr;

struct ArraySlots : py::detail::type_caster_base<NDArray> {
  // The NDArray held by `o`, or null when `o` is not one (or not built).
  static const NDArray* of(PyObject* o) {
    if (!PyObject_TypeCheck(o, g_array_type)) return nullptr;
    auto* inst = reinterpret_cast<py::detail::instance*>(o);
    py::detail::value_and_holder vh = inst->get_value_and_holder(nullptr, false);
    if (!vh || !vh.holder_constructed()) return nullptr;
    return static_cast<const NDArray*>(vh.value_ptr());
  }
  // A new Python object owning `r`.
  static PyObject* wrap(NDArray&& r) {
    return type_caster_generic::cast(&r, py::return_value_policy::move, py::handle(), g_array_info,
                                     make_copy_constructor(&r), make_move_constructor(&r))
        .ptr();
  }
};

// A number operand, as the bound methods take it (classify, above).
bool is_number(PyObject* o, double& v) { return classify(py::handle(o), v) == Operand::kNumber; }

// The bound methods, for what the fast paths do not take: a.name(b), then
// b.reflected(a) when that was NotImplemented (reflected null: in place).
PyObject* call_bound(PyObject* a, PyObject* b, const char* name, const char* reflected) {
  if (PyObject_TypeCheck(a, g_array_type)) {
    PyObject* r = PyObject_CallMethod(a, name, "O", b);
    if (r != Py_NotImplemented) return r;  // a result, or null with the error set
    Py_DECREF(r);
  }
  if (reflected != nullptr && PyObject_TypeCheck(b, g_array_type)) return PyObject_CallMethod(b, reflected, "O", a);
  Py_RETURN_NOTIMPLEMENTED;
}

template <class ArrayOp, class LeftNumber, class RightNumber>
PyObject* fast_binary(PyObject* a, PyObject* b, const char* name, const char* reflected, ArrayOp array_op,
                      LeftNumber number_left, RightNumber number_right) {
  try {
    double v = 0;
    if (const NDArray* x = ArraySlots::of(a)) {
      if (const NDArray* y = ArraySlots::of(b)) return ArraySlots::wrap(array_op(*x, *y));
      if (is_number(b, v)) return ArraySlots::wrap(number_right(*x, v));
    } else if (const NDArray* y = ArraySlots::of(b)) {
      if (is_number(a, v)) return ArraySlots::wrap(number_left(v, *y));
    }
  } catch (...) {
    // the bound method raises it as Python sees it
  }
  return call_bound(a, b, name, reflected);
}

template <class ArrayOp, class NumberOp>
PyObject* fast_inplace(PyObject* a, PyObject* b, const char* name, ArrayOp array_op, NumberOp number_op) {
  try {
    double v = 0;
    if (const NDArray* x = ArraySlots::of(a)) {
      auto* target = const_cast<NDArray*>(x);
      if (const NDArray* y = ArraySlots::of(b)) {
        array_op(*target, *y);
        Py_INCREF(a);
        return a;
      }
      if (is_number(b, v)) {
        number_op(*target, v);
        Py_INCREF(a);
        return a;
      }
    }
  } catch (...) {
  }
  return call_bound(a, b, name, nullptr);
}

#define LAZYDAG_FAST_BINARY(fn, name, reflected, op)                                                       \
  extern "C" PyObject* fn(PyObject* a, PyObject* b) {                                                       \
    return fast_binary(                                                                                     \
        a, b, name, reflected, [](const NDArray& x, const NDArray& y) { return x op y; },                  \
        [](double x, const NDArray& y) { return x op y; }, [](const NDArray& x, double y) { return x op y; }); \
  }
#define LAZYDAG_FAST_INPLACE(fn, name, op)                                                                  \
  extern "C" PyObject* fn(PyObject* a, PyObject* b) {                                                       \
    return fast_inplace(                                                                                    \
        a, b, name, [](NDArray& x, const NDArray& y) { x op y; }, [](NDArray& x, double y) { x op y; });   \
  }
LAZYDAG_FAST_BINARY(array_add, "__add__", "__radd__", +)
LAZYDAG_FAST_BINARY(array_sub, "__sub__", "__rsub__", -)
LAZYDAG_FAST_BINARY(array_mul, "__mul__", "__rmul__", *)
LAZYDAG_FAST_BINARY(array_div, "__truediv__", "__rtruediv__", /)
LAZYDAG_FAST_INPLACE(array_iadd, "__iadd__", +=)
LAZYDAG_FAST_INPLACE(array_isub, "__isub__", -=)
LAZYDAG_FAST_INPLACE(array_imul, "__imul__", *=)
LAZYDAG_FAST_INPLACE(array_idiv, "__itruediv__", /=)
#undef LAZYDAG_FAST_BINARY
#undef LAZYDAG_FAST_INPLACE

// After every operator is bound (the methods stay, for explicit calls and
// the cases above).
void install_number_slots(PyTypeObject* type) {
  g_array_type = type;
  g_array_info = py::detail::get_type_info(typeid(NDArray));
  PyNumberMethods* n = type->tp_as_number;
  if (n == nullptr || g_array_info == nullptr) return;  // the bound methods alone
  n->nb_add = &array_add;
  n->nb_subtract = &array_sub;
  n->nb_multiply = &array_mul;
  n->nb_true_divide = &array_div;
  n->nb_inplace_add = &array_iadd;
  n->nb_inplace_subtract = &array_isub;
  n->nb_inplace_multiply = &array_imul;
  n->nb_inplace_true_divide = &array_idiv;
  PyType_Modified(type);
}

}  // namespace

PYBIND11_MODULE(lazydag, m) {
  m.doc() = "lazydag: a lazy dataflow graph engine with a dependency scheduler, and NDArrays on it";
  m.attr("__version__") = LAZYDAG_VERSION;
  engine::set_stall_hooks({&stall_enter, &stall_leave});

  // Errors: lazydag.Error and its kinds, ValueError for bad input.
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<InvalidArgument> invalid(m, "InvalidArgument", PyExc_ValueError);
  g_invalid_argument = invalid.ptr();
  static py::exception<DeviceMismatch> mismatch(m, "DeviceMismatch", PyExc_ValueError);
  static py::exception<OpError> op_error(m, "OpError", error.ptr());
  static py::exception<BackendUnavailable> unavailable(m, "BackendUnavailable", error.ptr());
  static py::exception<WatchdogTimeout> watchdog(m, "WatchdogTimeout", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const DeviceMismatch& e) {
      mismatch(e.what());
    } catch (const InvalidArgument& e) {
      invalid(e.what());
    } catch (const OpError& e) {
      op_error(e.what());
    } catch (const BackendUnavailable& e) {
      unavailable(e.what());
    } catch (const WatchdogTimeout& e) {
      watchdog(e.what());
    } catch (const Error& e) {
      error(e.what());
    }
  });

  py::class_<Device>(m, "Device")
      .def_property_readonly("id", [](const Device& d) { return d.id; })
      .def_property_readonly("kind", [](const Device& d) { return d.str().substr(0, 3); })
      .def("__repr__", &Device::str)
      .def("__str__", &Device::str)
      .def("__eq__", [](const Device& a, const Device& b) { return a == b; })
      .def("__hash__", [](const Device& d) { return std::hash<std::string>()(d.str()); });
  m.def("cpu", &cpu, py::arg("id") = 0);
  m.def("sim", &sim, py::arg("id") = 0, "the emulated stream device (a GPU's streams and events on the host)");
  m.def("gpu", &gpu, py::arg("id") = 0);
  m.def("default_device", &default_device);
  m.def("set_default_device", &set_default_device);

  py::class_<NDArray> arr(m, "NDArray", py::buffer_protocol());
  // Our own slots: pybind11's call the export without catching, so a
  // refused export (an array on sim) would terminate, and cannot see
  // whether a writable buffer was asked for.
  auto* type = reinterpret_cast<PyTypeObject*>(arr.ptr());
  type->tp_as_buffer->bf_getbuffer = &get_buffer;
  type->tp_as_buffer->bf_releasebuffer = &release_buffer;
  arr.def_property_readonly("shape", [](const NDArray& a) { return shape_tuple(a.shape()); })
      .def_property_readonly("dtype", [](const NDArray& a) { return py::module_::import("numpy").attr("dtype")(std::string(to_string(a.dtype()))); })
      .def_property_readonly("device", &NDArray::device)
      .def_property_readonly("ndim", &NDArray::ndim)
      .def_property_readonly("size", &NDArray::size)
      .def("__len__", [](const NDArray& a) {
        if (a.ndim() == 0) throw py::type_error("len() of a 0-d array");
        return a.shape()[0];
      })
      // blockers: the GIL is released while they wait
      .def("wait_to_read", [](const NDArray& a) {
        Blocking nogil;
        a.wait_to_read();
      })
      .def("wait_to_write", [](const NDArray& a) {
        Blocking nogil;
        a.wait_to_write();
      })
      .def("item", [](const NDArray& a) -> py::object {
        if (a.size() != 1) throw InvalidArgument("item: needs an array of exactly one element");
        return asnumpy(a).attr("reshape")(py::tuple()).attr("item")();
      })
      .def("asnumpy", &asnumpy, "a NumPy copy (blocks until the array's writes are done)")
      .def("__dlpack__", &to_dlpack, py::arg("stream") = py::none(),
           "DLPack capsule of a CPU array's memory (blocks: waits to write)")
      .def("__dlpack_device__", [](const NDArray& a) {
        if (a.device().is_stream_device()) {
          throw InvalidArgument("__dlpack_device__: the array is on " + a.device().str() +
                                "; export a.copyto(lazydag.cpu()) (data never moves implicitly)");
        }
        return py::make_tuple(static_cast<int>(kDLCPU), 0);
      })
      .def("__array__", [](const NDArray& a, const py::object& dtype) {
        py::array r = asnumpy(a);
        return dtype.is_none() ? r : py::array(r.attr("astype")(dtype));
      }, py::arg("dtype") = py::none())
      .def("tolist", [](const NDArray& a) { return asnumpy(a).attr("tolist")(); })
      .def("__repr__", &repr)
      .def("__float__", [](const NDArray& a) { return py::float_(asnumpy(a).attr("reshape")(py::tuple()).attr("item")()); })
      // copies and devices
      .def("copy", &NDArray::copy)
      .def("astype", [](const NDArray& a, const py::object& t) { return a.astype(to_dtype(t)); })
      .def("copyto", &NDArray::copyto)
      .def("as_in_device", &NDArray::as_in_device)
      // shapes
      .def("reshape", [](const NDArray& a, py::args shape) {
        if (shape.size() == 1 && !py::isinstance<py::int_>(shape[0])) return a.reshape(to_shape(shape[0]));
        return a.reshape(shape.cast<Shape>());
      })
      .def("transpose", [](const NDArray& a, py::args axes) {
        if (axes.size() == 0) {
          std::vector<int> perm(static_cast<std::size_t>(a.ndim()));
          for (int i = 0; i < a.ndim(); ++i) perm[static_cast<std::size_t>(i)] = a.ndim() - 1 - i;
          return a.transpose(perm);
        }
        if (axes.size() == 1 && !py::isinstance<py::int_>(axes[0])) return a.transpose(axes[0].cast<std::vector<int>>());
        return a.transpose(axes.cast<std::vector<int>>());
      })
      .def_property_readonly("T", [](const NDArray& a) {
        std::vector<int> perm(static_cast<std::size_t>(a.ndim()));
        for (int i = 0; i < a.ndim(); ++i) perm[static_cast<std::size_t>(i)] = a.ndim() - 1 - i;
        return a.transpose(perm);
      })
      .def("slice", &NDArray::slice, py::arg("axis"), py::arg("start"), py::arg("stop"))
      // reductions
      .def("sum", [](const NDArray& a, const py::object& axis, bool keepdims) {
        return reduce(a, axis, keepdims, &NDArray::sum, &NDArray::sum);
      }, py::arg("axis") = py::none(), py::arg("keepdims") = false)
      .def("mean", [](const NDArray& a, const py::object& axis, bool keepdims) {
        return reduce(a, axis, keepdims, &NDArray::mean, &NDArray::mean);
      }, py::arg("axis") = py::none(), py::arg("keepdims") = false)
      .def("max", [](const NDArray& a, const py::object& axis, bool keepdims) {
        return reduce(a, axis, keepdims, &NDArray::max, &NDArray::max);
      }, py::arg("axis") = py::none(), py::arg("keepdims") = false)
      .def("min", [](const NDArray& a, const py::object& axis, bool keepdims) {
        return reduce(a, axis, keepdims, &NDArray::min, &NDArray::min);
      }, py::arg("axis") = py::none(), py::arg("keepdims") = false)
      .def("argmax", [](const NDArray& a, const py::object& axis, bool keepdims) {
        return reduce(a, axis, keepdims, &NDArray::argmax, &NDArray::argmax);
      }, py::arg("axis") = py::none(), py::arg("keepdims") = false)
      .def("assign", [](NDArray& a, const NDArray& b) { return a.assign(b); })
      // operators: arrays and Python numbers (a number takes the array's dtype)
      .def(-py::self)
      .def("__matmul__", [](const NDArray& a, const NDArray& b) { return nd::matmul(a, b); }, py::is_operator());
  def_operators(arr);
  install_number_slots(type);
  // autograd
  arr.def("attach_grad", [](NDArray& a) { a.attach_grad(); })
      .def("requires_grad_", [](NDArray& a, bool on) { a.requires_grad(on); return a; }, py::arg("requires_grad") = true)
      .def_property_readonly("requires_grad", [](const NDArray& a) { return a.requires_grad(); })
      .def_property_readonly("is_leaf", &NDArray::is_leaf)
      .def_property_readonly("grad", [](const NDArray& a) -> py::object {
        NDArray g = a.grad();
        if (!g.valid()) return py::none();
        return py::cast(g);
      })
      .def("zero_grad", &NDArray::zero_grad)
      .def("detach", &NDArray::detach)
      .def("backward", [](const NDArray& a, const py::object& gradient, bool retain_graph) {
        a.backward(gradient.is_none() ? NDArray() : gradient.cast<NDArray>(), retain_graph);
      }, py::arg("gradient") = py::none(), py::arg("retain_graph") = false,
         "records the gradients of every leaf this array depends on and returns at once");
  arr.attr("__hash__") = py::none();
  arr.attr("__array_priority__") = 1000;  // NumPy defers to our operators

  py::module_ ndm = m.def_submodule("nd", "array creation and math, as in mxnet.nd");
  ndm.def("zeros", [](const py::object& s, const py::object& t, const py::object& d) {
    return nd::zeros(to_shape(s), dtype_or(t, DType::kFloat32), device_or(d));
  }, py::arg("shape"), py::arg("dtype") = py::none(), py::arg("device") = py::none());
  ndm.def("ones", [](const py::object& s, const py::object& t, const py::object& d) {
    return nd::ones(to_shape(s), dtype_or(t, DType::kFloat32), device_or(d));
  }, py::arg("shape"), py::arg("dtype") = py::none(), py::arg("device") = py::none());
  ndm.def("full", [](const py::object& s, double v, const py::object& t, const py::object& d) {
    return nd::full(to_shape(s), v, dtype_or(t, DType::kFloat32), device_or(d));
  }, py::arg("shape"), py::arg("value"), py::arg("dtype") = py::none(), py::arg("device") = py::none());
  ndm.def("arange", [](double start, const py::object& stop, double step, const py::object& t, const py::object& d) {
    const bool one = stop.is_none();
    return nd::arange(one ? 0.0 : start, one ? start : stop.cast<double>(), step, dtype_or(t, DType::kFloat32),
                      device_or(d));
  }, py::arg("start"), py::arg("stop") = py::none(), py::arg("step") = 1.0, py::arg("dtype") = py::none(),
     py::arg("device") = py::none());
  ndm.def("array", &from_numpy, py::arg("data"), py::arg("dtype") = py::none(), py::arg("device") = py::none());
  ndm.def("random_uniform", [](const py::object& s, std::uint64_t seed, double lo, double hi, const py::object& t,
                               const py::object& d) {
    return nd::random_uniform(to_shape(s), device_or(d), seed, lo, hi, dtype_or(t, DType::kFloat32));
  }, py::arg("shape"), py::arg("seed") = 0, py::arg("low") = 0.0, py::arg("high") = 1.0,
     py::arg("dtype") = py::none(), py::arg("device") = py::none());
  ndm.def("random_normal", [](const py::object& s, std::uint64_t seed, double mean, double sd, const py::object& t,
                              const py::object& d) {
    return nd::random_normal(to_shape(s), device_or(d), seed, mean, sd, dtype_or(t, DType::kFloat32));
  }, py::arg("shape"), py::arg("seed") = 0, py::arg("mean") = 0.0, py::arg("stddev") = 1.0,
     py::arg("dtype") = py::none(), py::arg("device") = py::none());
  for (auto [name, fn] : {std::pair{"exp", &nd::exp}, std::pair{"log", &nd::log}, std::pair{"log1p", &nd::log1p},
                          std::pair{"sqrt", &nd::sqrt}, std::pair{"tanh", &nd::tanh}, std::pair{"sigmoid", &nd::sigmoid},
                          std::pair{"relu", &nd::relu}, std::pair{"abs", &nd::abs}, std::pair{"negative", &nd::neg}}) {
    ndm.def(name, fn);
    arr.def(name, fn);  // x.exp() as well as nd.exp(x)
  }
  using Binary = NDArray (*)(const NDArray&, const NDArray&);
  using WithScalar = NDArray (*)(const NDArray&, double);
  ndm.def("maximum", static_cast<Binary>(&nd::maximum));
  ndm.def("maximum", static_cast<WithScalar>(&nd::maximum));
  ndm.def("minimum", static_cast<Binary>(&nd::minimum));
  ndm.def("minimum", static_cast<WithScalar>(&nd::minimum));
  ndm.def("where", &nd::where);
  ndm.def("matmul", &nd::matmul);
  ndm.def("dot", &nd::dot);
  ndm.def("concat", &nd::concat, py::arg("arrays"), py::arg("axis") = 0);
  ndm.def("waitall", [] {
    Blocking nogil;
    nd::waitall();
  }, "blocks until everything recorded is done (the GIL is released meanwhile)");
  m.def("waitall", [] {
    Blocking nogil;
    nd::waitall();
  });

  m.def("engine_stats", [] {
    const engine::EngineStats s = nd::engine().stats();
    py::dict d;
    d["nodes_recorded"] = s.nodes_recorded;
    d["nodes_run"] = s.nodes_run;
    d["nodes_failed"] = s.nodes_failed;
    d["nodes_skipped"] = s.nodes_skipped;
    d["unfinished"] = s.unfinished;
    d["peak_unfinished"] = s.peak_unfinished;
    d["blocking_waits"] = s.blocking_waits;
    d["blocked_ns"] = s.blocked_ns;
    return d;
  }, "the process-wide engine's counters");
  // Sync debugging (docs/profiling.md): blocking calls are attributed to
  // the Python file and line that made them.
  m.def("set_sync_debug", [](const std::string& mode) { engine::set_sync_debug(engine::parse_sync_debug(mode)); },
        "'off', 'warn' (report each blocking call site once, and a summary at exit) or 'error' (refuse them)");
  m.def("sync_debug", [] {
    switch (engine::sync_debug()) {
      case engine::SyncDebug::kOff: return "off";
      case engine::SyncDebug::kWarn: return "warn";
      case engine::SyncDebug::kError: return "error";
    }
    return "off";
  });
  m.def("blocking_sites", [] {
    py::list out;
    for (const engine::BlockingSite& b : engine::blocking_sites()) {
      py::dict d;
      d["file"] = b.file;
      d["line"] = b.line;
      d["function"] = b.function;
      d["kind"] = std::string(engine::to_string(b.kind));
      d["count"] = b.count;
      d["blocked_seconds"] = b.blocked_seconds;
      out.append(d);
    }
    return out;
  }, "every blocking call site seen while sync debugging was on, most blocked time first");
  m.def("blocking_report", &engine::blocking_report);
  m.def("clear_blocking_sites", &engine::clear_blocking_sites);
  // The profiler: a Chrome/Perfetto trace of every node (docs/profiling.md).
  py::module_ prof = m.def_submodule("profiler", "the engine's trace profiler");
  prof.def("start", &profiler::start);
  prof.def("stop", &profiler::stop);
  prof.def("running", &profiler::running);
  prof.def("dump", [](const std::string& path) {
    py::gil_scoped_release nogil;
    profiler::dump(path);
  }, py::arg("path"), "writes the trace as JSON (chrome://tracing, ui.perfetto.dev)");
  prof.def("event_count", &profiler::event_count);
  m.def("engine_policy", [] { return std::string(engine::to_string(nd::engine().policy())); });
  m.def("num_threads", [] { return nd::engine().num_threads(); });

  // Losses, gathers and files (the training chapter of docs/guide.md).
  ndm.def("softmax", &nd::softmax, py::arg("x"), py::arg("axis") = -1);
  ndm.def("log_softmax", &nd::log_softmax, py::arg("x"), py::arg("axis") = -1);
  ndm.def("logsumexp", &nd::logsumexp, py::arg("x"), py::arg("axis") = -1, py::arg("keepdims") = false);
  ndm.def("cross_entropy", py::overload_cast<const NDArray&, const NDArray&, double>(&nd::cross_entropy),
          py::arg("logits"), py::arg("labels"), py::arg("label_smoothing") = 0.0);
  ndm.def("mse_loss", &nd::mse_loss);
  ndm.def("clip", &nd::clip);
  ndm.def("take", [](const NDArray& a, const NDArray& indices, const py::object& axis) {
    return axis.is_none() ? nd::take(a, indices) : nd::take(a, indices, axis.cast<int>());
  }, py::arg("a"), py::arg("indices"), py::arg("axis") = py::none(), "rows of a (axis 0) unless axis is given");
  ndm.def("argsort", [](const NDArray& a, int axis, bool descending) { return nd::argsort(a, axis, descending); },
          py::arg("a"), py::arg("axis") = -1, py::arg("descending") = false);
  ndm.def("sort", [](const NDArray& a, int axis, bool descending) { return nd::sort(a, axis, descending); },
          py::arg("a"), py::arg("axis") = -1, py::arg("descending") = false);
  ndm.def("take_along_axis", &nd::take_along_axis, py::arg("a"), py::arg("indices"), py::arg("axis"));
  ndm.def("permutation", [](std::int64_t n, std::uint64_t seed, const py::object& d) {
    return nd::permutation(n, seed, device_or(d));
  }, py::arg("n"), py::arg("seed") = 0, py::arg("device") = py::none());
  ndm.def("save_npy", [](const std::string& path, const NDArray& a) {
    Blocking nogil;
    nd::save_npy(path, a);
  });
  ndm.def("load_npy", [](const std::string& path, const py::object& d) { return nd::load_npy(path, device_or(d)); },
          py::arg("path"), py::arg("device") = py::none());

  // lazydag.dist: the collectives of lazydag::dist (docs/distributed.md),
  // recorded like any op; run the script under mpirun. Without MPI in this
  // build every call raises BackendUnavailable. barrier() and finalize()
  // block (GIL released).
  py::module_ dm = m.def_submodule("dist", "collectives over MPI ranks, recorded as engine nodes");
  auto reduce_op = [](const std::string& name) {
    if (name == "sum") return dist::ReduceOp::kSum;
    if (name == "mean") return dist::ReduceOp::kMean;
    if (name == "max") return dist::ReduceOp::kMax;
    if (name == "min") return dist::ReduceOp::kMin;
    throw InvalidArgument("dist: unknown reduction '" + name + "' (sum, mean, max, min)");
  };
  dm.def("available", &dist::available, "whether this build has MPI");
  dm.def("init", &dist::init);
  dm.def("finalize", [] {
    Blocking nogil;
    dist::finalize();
  });
  dm.def("rank", &dist::rank);
  dm.def("size", &dist::size);
  dm.def("allreduce", [reduce_op](const NDArray& x, const std::string& op) { return dist::allreduce(x, reduce_op(op)); },
         py::arg("x"), py::arg("op") = "sum");
  dm.def("reduce_scatter",
         [reduce_op](const NDArray& x, const std::string& op) { return dist::reduce_scatter(x, reduce_op(op)); },
         py::arg("x"), py::arg("op") = "sum");
  dm.def("broadcast", &dist::broadcast, py::arg("x"), py::arg("root") = 0);
  dm.def("allgather", &dist::allgather, py::arg("x"));
  dm.def("send", &dist::send, py::arg("x"), py::arg("dest"), py::arg("tag") = 0);
  dm.def("recv", [](const py::object& shape, const py::object& dtype, int source, int tag, const py::object& d) {
    return dist::recv(to_shape(shape), to_dtype(dtype), source, tag, device_or(d));
  }, py::arg("shape"), py::arg("dtype"), py::arg("source"), py::arg("tag") = 0, py::arg("device") = py::none());
  dm.def("barrier", [] {
    Blocking nogil;
    dist::barrier();
  });

  // Fusion of elementwise ops (docs/architecture.md, "Fusion").
  m.def("set_fusion", &nd::set_fusion, py::arg("on"));
  m.def("fusion_enabled", &nd::fusion_enabled);
  m.def("flush_fused", &nd::flush_fused);

  // lazydag.nn, lazydag.optim, lazydag.MetricLog, lazydag.dist.DataParallel
  lazydag_py::bind_training(m, dm);

  // Grad mode: `with lazydag.autograd.no_grad(): ...`
  py::module_ ag = m.def_submodule("autograd", "grad mode, per thread");
  ag.def("is_grad_enabled", &autograd::is_grad_enabled);
  ag.def("set_grad_enabled", &autograd::set_grad_enabled);
  struct NoGrad {
    bool previous = true;
  };
  py::class_<NoGrad>(ag, "no_grad")
      .def(py::init<>())
      .def("__enter__", [](NoGrad& g) {
        g.previous = autograd::is_grad_enabled();
        autograd::set_grad_enabled(false);
      })
      .def("__exit__", [](NoGrad& g, const py::object&, const py::object&, const py::object&) {
        autograd::set_grad_enabled(g.previous);
      });
}
