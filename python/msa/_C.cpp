// msa._C: the nanobind module under the Python package. It turns any DLPack tensor (numpy, torch,
// cupy, jax; CPU or CUDA, any dtype and strides) into a non-owning msa::TensorView, calls the C++ entry
// points with the GIL released, and maps msa::Error kinds onto Python exceptions. Argument
// defaults, output allocation and stream selection live in python/msa/*.py; this file only converts.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "msa/msa.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Host length arrays of the plans; python/msa/plan.py hands them over as contiguous int32 numpy arrays.
using HostLengths = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Read-only and writable imports share one handle type so that Call can keep both alive.
using Imported = nb::ndarray<nb::ro>;

// numpy dtypes of ml_dtypes that neither numpy's DLPack export nor its buffer protocol can describe
// (numpy raises "DLPack only supports ... float and complex dtypes"): such arrays are imported
// through an unsigned-integer view of the same bytes, and the real dtype is declared here.
struct OpaqueNumpyDtype {
  const char* name;     // numpy dtype.name
  const char* carrier;  // same-width dtype numpy can export
  msa::DType dtype;
};
constexpr OpaqueNumpyDtype kOpaqueNumpyDtypes[] = {
    {"bfloat16", "uint16", msa::DType::kBF16},
    {"float8_e4m3fn", "uint8", msa::DType::kF8E4M3},
};

// DLPack's C exchange API (DLPack >= 1.2; torch >= 2.10 sets it on its tensor type): a tensor's description
// and its framework's current stream through C function pointers. On the H200 machine t.__dlpack__(), which
// nanobind's import calls, takes ~2.5 us per torch tensor and torch.cuda.current_stream() ~4 us, so that an
// eager msa.attention would spend ~24 us of its ~37-59 us of host time there (bench/run_host.py). The
// layout below is DLPack 1.x's DLPackExchangeAPI (the header of a DLPack <= 1.1 install does not declare
// it).
struct ExchangeApiV1 {
  struct {
    uint32_t major, minor;
    void* prev_api;
  } header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);  // may be NULL
  int (*current_work_stream)(DLDeviceType device_type, int32_t device_id, void** out_current_stream);
};

// What the fast import knows of a tensor type: its exchange API (nullptr: none usable), and whether it is
// torch's (whose tensors are always writable).
struct FastType {
  PyTypeObject* type;
  const ExchangeApiV1* api;
  bool torch;
};

bool g_fast_import = true;  // msa._C._set_fast_import (tests compare both paths)

// The stream argument that stands for "the current stream of the tensors' framework" (Call::stream).
constexpr int64_t kCurrentStream = -1;

const ExchangeApiV1* lookup_exchange_api(PyTypeObject* tp) {
  for (const char* attr : {"__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__"}) {
    PyObject* a = PyObject_GetAttrString(reinterpret_cast<PyObject*>(tp), attr);
    if (a == nullptr) {
      PyErr_Clear();
      continue;
    }
    void* ptr = nullptr;
    if (PyCapsule_CheckExact(a)) ptr = PyCapsule_GetPointer(a, "dlpack_exchange_api");
    else if (PyLong_Check(a)) ptr = PyLong_AsVoidPtr(a);
    Py_DECREF(a);
    if (PyErr_Occurred()) PyErr_Clear();
    const auto* api = static_cast<const ExchangeApiV1*>(ptr);
    if (api != nullptr && api->header.major == 1 && api->current_work_stream != nullptr) return api;
  }
  return nullptr;
}

// The fast-import facts of tp, looked up once per type (with the GIL held; the first 32 types seen are kept
// alive by a reference so that their address cannot be reused by another type).
FastType fast_type(PyTypeObject* tp) {
  static std::vector<FastType> seen;
  for (const FastType& f : seen)
    if (f.type == tp) return f;
  FastType f{tp, lookup_exchange_api(tp), false};
  if (f.api != nullptr) {
    PyObject* mod = PyObject_GetAttrString(reinterpret_cast<PyObject*>(tp), "__module__");
    if (mod == nullptr) PyErr_Clear();
    const char* m = mod != nullptr && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : nullptr;
    if (m == nullptr) PyErr_Clear();
    f.torch = m != nullptr && std::strncmp(m, "torch", 5) == 0;
    Py_XDECREF(mod);
  }
  if (seen.size() < 32) {
    Py_INCREF(reinterpret_cast<PyObject*>(tp));
    seen.push_back(f);
  }
  return f;
}

std::string py_type_name(nb::handle obj) {
  return nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).attr("__name__")));
}

// One binding call: imports its tensor arguments, keeps the imports alive until the call returns,
// and names the entry point and the argument in every conversion error.
class Call {
 public:
  explicit Call(const char* fn) : fn_(fn) {}

  // An input the call only reads; None is an absent view.
  msa::TensorView in(nb::handle obj, const char* name) { return import(obj, name, /*writable=*/false); }
  // An input or output the call cannot do without: None is refused, naming it (the bindings take None for it, so
  // that this message, not nanobind's signature list, is what the caller reads).
  msa::TensorView need(nb::handle obj, const char* name, bool writable = false) {
    if (obj.is_none()) MSA_FAIL(kValue, fn_, ": argument '", name, "' is required");
    return import(obj, name, writable);
  }
  // An output the call writes; None is an absent view (optional outputs such as lse).
  msa::TensorView out(nb::handle obj, const char* name) { return import(obj, name, /*writable=*/true); }

  // The stream argument of a binding: a cudaStream_t handle, or kCurrentStream for the current stream of the
  // framework of `like` (a torch tensor whose type has the DLPack C exchange API: python/msa/_framework.py
  // resolve_stream asks _current_stream_through_api first), asked through that API, or should it fail, through
  // torch.cuda.current_stream. `view` is like's import.
  void* stream(int64_t handle, nb::handle like, const msa::TensorView& view) const {
    if (handle != kCurrentStream) return reinterpret_cast<void*>(static_cast<uintptr_t>(handle));
    if (!view.defined() || !view.device().is_cuda()) return nullptr;
    const FastType f = g_fast_import ? fast_type(Py_TYPE(like.ptr())) : FastType{nullptr, nullptr, false};
    void* s = nullptr;
    if (f.api != nullptr) {
      if (f.api->current_work_stream(kDLCUDA, view.device().id, &s) == 0) return s;
      PyErr_Clear();
    }
    nb::object torch_stream = nb::module_::import_("torch").attr("cuda").attr("current_stream")(view.device().id);
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(torch_stream.attr("cuda_stream")));
  }

 private:
  msa::TensorView import(nb::handle obj, const char* name, bool writable) {
    if (obj.is_none()) return {};
    if (g_fast_import) {
      if (std::optional<msa::TensorView> v = try_fast_import(obj, name, writable)) return *v;
    }
    std::optional<msa::DType> declared;
    std::optional<Imported> arr = try_import(obj, writable);
    if (!arr) {
      if (const OpaqueNumpyDtype* od = opaque_numpy_dtype(obj)) {
        arr = try_import(obj.attr("view")(od->carrier), writable);
        declared = od->dtype;
      }
    }
    if (!arr) fail_import(obj, name, writable);
    return to_view(*arr, name, declared);
  }

  // Through the type's DLPack C exchange API: outputs only for torch tensors (the API does not say whether a
  // tensor is read-only; torch's never are). A tensor that requires grad is read as it is, as the __dlpack__
  // path reads it (nanobind falls back to torch.utils.dlpack.to_dlpack when __dlpack__ refuses it).
  // nullopt: take the __dlpack__ path.
  std::optional<msa::TensorView> try_fast_import(nb::handle obj, const char* name, bool writable) {
    const FastType f = fast_type(Py_TYPE(obj.ptr()));
    if (f.api == nullptr || f.api->dltensor_from_py_object_no_sync == nullptr || (writable && !f.torch))
      return std::nullopt;
    DLTensor t{};
    if (f.api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) {
      PyErr_Clear();
      return std::nullopt;
    }
    return view_of(static_cast<char*>(t.data) + t.byte_offset, t.dtype.code, t.dtype.bits, t.dtype.lanes, t.ndim,
                   t.shape, t.strides, t.device.device_type, t.device.device_id, name, std::nullopt);
  }

  // No implicit conversion: a converted copy of an output would silently drop the results.
  std::optional<Imported> try_import(nb::handle obj, bool writable) {
    if (writable) {
      nb::ndarray<> a;
      if (!nb::try_cast(obj, a, /*convert=*/false)) return std::nullopt;
      keep_.emplace_back(a);
    } else {
      Imported a;
      if (!nb::try_cast(obj, a, /*convert=*/false)) return std::nullopt;
      keep_.push_back(a);
    }
    return keep_.back();
  }

  static const OpaqueNumpyDtype* opaque_numpy_dtype(nb::handle obj) {
    nb::object ndarray_type = nb::module_::import_("numpy").attr("ndarray");
    if (!nb::isinstance(obj, ndarray_type)) return nullptr;
    const std::string name = nb::cast<std::string>(obj.attr("dtype").attr("name"));
    for (const OpaqueNumpyDtype& od : kOpaqueNumpyDtypes)
      if (name == od.name) return &od;
    return nullptr;
  }

  [[noreturn]] void fail_import(nb::handle obj, const char* name, bool writable) {
    if (writable) {
      Imported ro;
      if (nb::try_cast(obj, ro, false))
        MSA_FAIL(kValue, fn_, ": argument '", name, "': expected a writable tensor, got a read-only ",
                 py_type_name(obj));
    }
    // Let the producer say why it refused (numpy object arrays: "DLPack only supports signed/unsigned
    // integers, float and complex dtypes").
    if (nb::hasattr(obj, "__dlpack__")) {
      try {
        obj.attr("__dlpack__")();
      } catch (nb::python_error& e) {
        MSA_FAIL(kType, fn_, ": argument '", name, "': the ", py_type_name(obj),
                 " cannot be exported through DLPack: ", e.what());
      }
    }
    MSA_FAIL(kType, fn_, ": argument '", name, "': expected a DLPack tensor (numpy array, torch tensor, ...), got ",
             py_type_name(obj));
  }

  msa::TensorView to_view(const Imported& a, const char* name, std::optional<msa::DType> declared) const {
    const nb::dlpack::dtype dl = a.dtype();
    return view_of(const_cast<void*>(a.data()), dl.code, dl.bits, dl.lanes, static_cast<int>(a.ndim()), a.shape_ptr(),
                   a.stride_ptr(), a.device_type(), a.device_id(), name, declared);
  }

  msa::TensorView view_of(void* data, uint8_t code, uint8_t bits, uint16_t lanes, int ndim, const int64_t* shape,
                          const int64_t* strides, int32_t device_type, int32_t device_id, const char* name,
                          std::optional<msa::DType> declared) const {
    // A dtype msa does not take is imported as it is: the entry point's dtype checks name the argument
    // and the dtypes that argument takes.
    const DLDataType dtype = declared ? msa::dtype_to_dl(*declared) : DLDataType{code, bits, lanes};
    MSA_CHECK(ndim <= msa::TensorView::kMaxDims, kValue, fn_, ": argument '", name, "': expected at most ",
              msa::TensorView::kMaxDims, " dimensions, got ", ndim);
    msa::Device device;
    switch (device_type) {
      case kDLCPU: case kDLCUDAHost: device = {msa::DeviceType::kCPU, 0}; break;
      case kDLCUDA: case kDLCUDAManaged: device = {msa::DeviceType::kCUDA, device_id}; break;
      default:
        MSA_FAIL(kType, fn_, ": argument '", name, "': expected a CPU or CUDA tensor, got DLPack device type ",
                 device_type);
    }
    return msa::TensorView(data, dtype, ndim, shape, strides, device);
  }

  const char* fn_;
  std::vector<Imported> keep_;
};

PyObject* exception_type(msa::ErrorKind kind) {
  switch (kind) {
    case msa::ErrorKind::kValue: return PyExc_ValueError;
    case msa::ErrorKind::kType: return PyExc_TypeError;
    case msa::ErrorKind::kNotImplemented: return PyExc_NotImplementedError;
    case msa::ErrorKind::kRuntime: return PyExc_RuntimeError;
  }
  return PyExc_RuntimeError;
}

msa::ScoreLayout parse_layout(const char* fn, const std::string& layout) {
  if (layout == "HKT") return msa::ScoreLayout::kHKT;
  if (layout == "THK") return msa::ScoreLayout::kTHK;
  MSA_FAIL(kValue, fn, ": argument 'layout': expected 'HKT' ([num_heads, max_blocks, total_q]) or 'THK' ",
           "([total_q, num_heads, max_blocks]), got '", layout, "'");
}

msa::Device parse_device(const char* fn, const std::string& type, int id) {
  if (type == "cpu") return {msa::DeviceType::kCPU, 0};
  MSA_CHECK(type == "cuda", kValue, fn, ": argument 'device': expected 'cpu' or 'cuda', got '", type, "'");
  MSA_CHECK(id >= 0, kValue, fn, ": argument 'device': expected a CUDA ordinal >= 0, got ", id);
  return {msa::DeviceType::kCUDA, id};
}

msa::AttentionConfig make_config(int num_qo_heads, int num_kv_heads, int head_dim, int head_dim_v, int page_size,
                                 int topk, bool causal) {
  msa::AttentionConfig c;
  c.num_qo_heads = num_qo_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.head_dim_v = head_dim_v;
  c.page_size = page_size;
  c.topk = topk;
  c.causal = causal;
  return c;
}

std::string plan_repr(const msa::Plan& p) {
  const msa::AttentionConfig& c = p.config();
  return msa::detail::concat(
      "msa.Plan(phase='", p.phase() == msa::Phase::kPrefill ? "prefill" : "decode", "', device='",
      msa::device_name(p.device()), "', batch_size=", p.batch_size(), ", max_qo_len=", p.max_qo_len(),
      ", max_kv_len=", p.max_kv_len(), ", total_q=", p.total_q(), ", num_qo_heads=", c.num_qo_heads,
      ", num_kv_heads=", c.num_kv_heads, ", head_dim=", c.head_dim, ", head_dim_v=", c.dv(),
      ", page_size=", c.page_size, ", topk=", c.topk, ", causal=", c.causal ? "True" : "False", ")");
}

void bind_plan(nb::module_& m) {
  nb::class_<msa::Plan>(m, "Plan",
                        "An attention plan from msa.plan_prefill or msa.plan_decode: what msa.attention computes "
                        "(heads, head dims, page size, top-k, causality), where it runs, and the workspaces it "
                        "owns. Read-only. One run of a plan at a time: two runs in flight at once (two streams, "
                        "two threads) share its workspaces and give wrong results; plan.clone() gives a second "
                        "plan with workspaces of its own.")
      .def_prop_ro("phase", [](const msa::Plan& p) { return p.phase() == msa::Phase::kPrefill ? "prefill" : "decode"; },
                   "'prefill' or 'decode'.")
      .def_prop_ro("device", [](const msa::Plan& p) { return msa::device_name(p.device()); },
                   "'cpu' or 'cuda:N'.")
      .def_prop_ro("batch_size", &msa::Plan::batch_size, "Number of requests.")
      .def_prop_ro("max_qo_len", &msa::Plan::max_qo_len, "Longest query run of a request (decode: the bound).")
      .def_prop_ro("max_kv_len", &msa::Plan::max_kv_len, "Longest key run of a request (decode: the bound).")
      .def_prop_ro("total_q", &msa::Plan::total_q,
                   "Prefill: the sum of qo_lens. Decode: batch_size * max_qo_len (an upper bound).")
      .def_prop_ro("num_qo_heads", [](const msa::Plan& p) { return p.config().num_qo_heads; }, "Query heads Hq.")
      .def_prop_ro("num_kv_heads", [](const msa::Plan& p) { return p.config().num_kv_heads; }, "KV heads Hkv.")
      .def_prop_ro("head_dim", [](const msa::Plan& p) { return p.config().head_dim; }, "D of q and k.")
      .def_prop_ro("head_dim_v", [](const msa::Plan& p) { return p.config().dv(); },
                   "D of v and o (head_dim when planned with head_dim_v=0).")
      .def_prop_ro("page_size", [](const msa::Plan& p) { return p.config().page_size; }, "Tokens per KV page.")
      .def_prop_ro("topk", [](const msa::Plan& p) { return p.config().topk; },
                   "Slots per block_idx row; 0 for dense attention.")
      .def_prop_ro("causal", [](const msa::Plan& p) { return p.config().causal; }, "Causal masking.")
      .def(
          "describe",
          [](const msa::Plan& p) {
            nb::dict d;
            const std::string s = p.describe();
            for (size_t at = 0; at < s.size();) {
              size_t end = s.find(' ', at);
              if (end == std::string::npos) end = s.size();
              const std::string kv = s.substr(at, end - at);
              const size_t eq = kv.find('=');
              if (eq != std::string::npos) d[nb::str(kv.substr(0, eq).c_str())] = nb::str(kv.substr(eq + 1).c_str());
              at = end + 1;
            }
            return d;
          },
          "How the plan runs, as a dict of strings: 'backend' ('cpu' or 'cuda'), 'phase', and for CUDA plans "
          "the kernel family of each path and its work split, e.g. {'paged': 'token', 'splits': '16', "
          "'merge': 'push', ...} for a single-token decode plan on Hopper, or 'sm90': 'prefill' with "
          "'kvmajor' for the Hopper prefill kernels. For logs and tests; keys may be added.")
      .def(
          "clone",
          [](const msa::Plan& p) {
            nb::gil_scoped_release nogil;
            return p.clone();
          },
          "A plan of the same configuration, device and lengths with workspaces of its own, for runs that may "
          "overlap this plan's (another stream or thread); planning runs again and never waits on the device.")
      .def("__repr__", &plan_repr);
}

void bind_plans(nb::module_& m) {
  m.def(
      "plan_prefill",
      [](HostLengths qo_lens, HostLengths kv_lens, std::optional<HostLengths> qo_offset, int num_qo_heads,
         int num_kv_heads, int head_dim, int head_dim_v, int page_size, int topk, bool causal,
         const std::string& device_type, int device_id, int max_splits, int fixed_split_blocks) {
        const char* fn = "msa.plan_prefill";
        const msa::Device device = parse_device(fn, device_type, device_id);
        const msa::AttentionConfig cfg =
            make_config(num_qo_heads, num_kv_heads, head_dim, head_dim_v, page_size, topk, causal);
        const msa::SplitOptions split{max_splits, fixed_split_blocks};
        std::span<const int32_t> off;
        if (qo_offset) off = {qo_offset->data(), qo_offset->shape(0)};
        nb::gil_scoped_release nogil;
        return msa::plan_prefill(cfg, device, {qo_lens.data(), qo_lens.shape(0)},
                                 {kv_lens.data(), kv_lens.shape(0)}, off, split);
      },
      "qo_lens"_a, "kv_lens"_a, "qo_offset"_a.none(), "num_qo_heads"_a, "num_kv_heads"_a, "head_dim"_a,
      "head_dim_v"_a, "page_size"_a, "topk"_a, "causal"_a, "device_type"_a, "device_id"_a, "max_splits"_a,
      "fixed_split_blocks"_a, "Binding of msa::plan_prefill; use msa.plan_prefill.");

  m.def(
      "plan_decode",
      [](int batch_size, int max_qo_len, int64_t max_kv_len, int num_qo_heads, int num_kv_heads, int head_dim,
         int head_dim_v, int page_size, int topk, bool causal, const std::string& device_type, int device_id,
         int max_splits, int fixed_split_blocks) {
        const msa::Device device = parse_device("msa.plan_decode", device_type, device_id);
        const msa::AttentionConfig cfg =
            make_config(num_qo_heads, num_kv_heads, head_dim, head_dim_v, page_size, topk, causal);
        const msa::SplitOptions split{max_splits, fixed_split_blocks};
        nb::gil_scoped_release nogil;
        return msa::plan_decode(cfg, device, batch_size, max_qo_len, max_kv_len, split);
      },
      "batch_size"_a, "max_qo_len"_a, "max_kv_len"_a, "num_qo_heads"_a, "num_kv_heads"_a, "head_dim"_a,
      "head_dim_v"_a, "page_size"_a, "topk"_a, "causal"_a, "device_type"_a, "device_id"_a, "max_splits"_a,
      "fixed_split_blocks"_a, "Binding of msa::plan_decode; use msa.plan_decode.");
}

void bind_ops(nb::module_& m) {
  m.def(
      "attention",
      [](const msa::Plan& plan, nb::handle q, nb::handle k, nb::handle v, nb::handle page_table,
         nb::handle page_indptr, nb::handle qo_indptr, nb::handle kv_lens, nb::handle qo_offset, nb::handle block_idx,
         nb::handle o, nb::handle lse, float sm_scale, bool validate, int64_t stream, float q_scale, float k_scale,
         float v_scale) {
        Call call("msa.attention");
        const msa::TensorView q_v = call.need(q, "q"), k_v = call.need(k, "k_cache"), v_v = call.need(v, "v_cache");
        const msa::PageTable pages{call.need(page_table, "page_table"), call.in(page_indptr, "page_indptr")};
        const msa::Sequences seqs{call.need(qo_indptr, "qo_indptr"), call.need(kv_lens, "kv_lens"),
                                  call.in(qo_offset, "qo_offset")};
        const msa::TensorView bi = call.in(block_idx, "block_idx");
        const msa::TensorView o_v = call.out(o, "out"), lse_v = call.out(lse, "lse");
        const msa::RunOptions opts{sm_scale, call.stream(stream, q, q_v), validate, q_scale, k_scale, v_scale};
        nb::gil_scoped_release nogil;
        msa::attention(plan, q_v, k_v, v_v, pages, seqs, bi, o_v, lse_v, opts);
      },
      "plan"_a, "q"_a.none(), "k_cache"_a.none(), "v_cache"_a.none(), "page_table"_a.none(), "page_indptr"_a.none(),
      "qo_indptr"_a.none(), "kv_lens"_a.none(), "qo_offset"_a.none(), "block_idx"_a.none(), "out"_a, "lse"_a.none(), "sm_scale"_a,
      "validate"_a, "stream"_a = 0, "q_scale"_a = 1.0f, "k_scale"_a = 1.0f, "v_scale"_a = 1.0f,
      "Binding of msa::attention; use msa.attention.");

  m.def(
      "block_scores",
      [](nb::handle q, nb::handle k_index, nb::handle k_scale, nb::handle page_table, nb::handle page_indptr,
         nb::handle qo_indptr, nb::handle kv_lens, nb::handle qo_offset, nb::handle out, const std::string& layout,
         bool causal, bool validate, int64_t stream) {
        const char* fn = "msa.block_scores";
        Call call(fn);
        const msa::ScoreLayout lay = parse_layout(fn, layout);
        const msa::TensorView q_v = call.need(q, "q"), k_v = call.need(k_index, "k_index");
        const msa::TensorView ks_v = call.in(k_scale, "k_scale");
        const msa::PageTable pages{call.need(page_table, "page_table"), call.in(page_indptr, "page_indptr")};
        const msa::Sequences seqs{call.need(qo_indptr, "qo_indptr"), call.need(kv_lens, "kv_lens"),
                                  call.in(qo_offset, "qo_offset")};
        const msa::TensorView out_v = call.out(out, "out");
        const msa::RunOptions opts{0.0f, call.stream(stream, q, q_v), validate};
        nb::gil_scoped_release nogil;
        msa::block_scores(q_v, k_v, ks_v, pages, seqs, out_v, lay, causal, opts);
      },
      "q"_a.none(), "k_index"_a.none(), "k_scale"_a.none(), "page_table"_a.none(), "page_indptr"_a.none(),
      "qo_indptr"_a.none(), "kv_lens"_a.none(),
      "qo_offset"_a.none(), "out"_a, "layout"_a, "causal"_a, "validate"_a, "stream"_a = 0,
      "Binding of msa::block_scores; use msa.block_scores.");

  m.def(
      "select_topk",
      [](nb::handle scores, nb::handle qo_indptr, nb::handle kv_lens, int topk, nb::handle qo_offset,
         const std::string& layout, int force_begin, int force_end, bool causal, nb::handle out, bool validate,
         int64_t stream, bool finite_only, nb::handle block_map, nb::handle out_scores) {
        const char* fn = "msa.select_topk";
        Call call(fn);
        const msa::ScoreLayout lay = parse_layout(fn, layout);
        const msa::TensorView s_v = call.need(scores, "scores");
        const msa::Sequences seqs{call.need(qo_indptr, "qo_indptr"), call.need(kv_lens, "kv_lens"),
                                  call.in(qo_offset, "qo_offset")};
        const msa::TensorView out_v = call.out(out, "out");
        const msa::SelectTopkOptions select{finite_only, call.in(block_map, "block_map"),
                                            call.out(out_scores, "out_scores")};
        const msa::RunOptions opts{0.0f, call.stream(stream, scores, s_v), validate};
        nb::gil_scoped_release nogil;
        msa::select_topk(s_v, lay, seqs, topk, force_begin, force_end, out_v, causal, opts, select);
      },
      "scores"_a.none(), "qo_indptr"_a.none(), "kv_lens"_a.none(), "topk"_a, "qo_offset"_a.none(), "layout"_a, "force_begin"_a,
      "force_end"_a, "causal"_a, "out"_a, "validate"_a, "stream"_a = 0, "finite_only"_a = false,
      "block_map"_a.none() = nb::none(), "out_scores"_a.none() = nb::none(),
      "Binding of msa::select_topk; use msa.select_topk.");

  m.def(
      "merge_candidates",
      [](nb::handle cand_scores, nb::handle cand_ids, nb::handle qo_indptr, nb::handle kv_lens, nb::handle qo_offset,
         int max_blocks, int topk, int force_begin, int force_end, bool causal, nb::handle out, bool validate,
         int64_t stream) {
        Call call("msa.merge_candidates");
        const msa::TensorView s_v = call.need(cand_scores, "cand_scores"), i_v = call.need(cand_ids, "cand_ids");
        const msa::Sequences seqs{call.need(qo_indptr, "qo_indptr"), call.need(kv_lens, "kv_lens"),
                                  call.in(qo_offset, "qo_offset")};
        const msa::TensorView out_v = call.out(out, "out");
        const msa::RunOptions opts{0.0f, call.stream(stream, cand_scores, s_v), validate};
        nb::gil_scoped_release nogil;
        msa::merge_candidates(s_v, i_v, seqs, max_blocks, topk, force_begin, force_end, out_v, causal, opts);
      },
      "cand_scores"_a.none(), "cand_ids"_a.none(), "qo_indptr"_a.none(), "kv_lens"_a.none(), "qo_offset"_a.none(),
      "max_blocks"_a, "topk"_a,
      "force_begin"_a, "force_end"_a, "causal"_a, "out"_a, "validate"_a, "stream"_a = 0,
      "Binding of msa::merge_candidates; use msa.merge_candidates.");

  m.def(
      "merge_states",
      [](nb::handle v_parts, nb::handle lse_parts, nb::handle out, nb::handle lse_out, int64_t stream) {
        Call call("msa.merge_states");
        const msa::TensorView v_v = call.need(v_parts, "v_parts"), l_v = call.need(lse_parts, "lse_parts");
        const msa::TensorView o_v = call.out(out, "out"), lo_v = call.out(lse_out, "lse_out");
        const msa::RunOptions opts{0.0f, call.stream(stream, v_parts, v_v), false};
        nb::gil_scoped_release nogil;
        msa::merge_states(v_v, l_v, o_v, lo_v, opts);
      },
      "v_parts"_a.none(), "lse_parts"_a.none(), "out"_a, "lse_out"_a.none(), "stream"_a = 0,
      "Binding of msa::merge_states; use msa.merge_states.");

  m.def(
      "build_page_table",
      [](nb::handle req_to_token, nb::handle req_pool_indices, nb::handle seq_lens, int page_size, nb::handle out,
         bool validate, int64_t stream) {
        Call call("msa.build_page_table");
        const msa::TensorView r_v = call.need(req_to_token, "req_to_token");
        const msa::TensorView i_v = call.need(req_pool_indices, "req_pool_indices");
        const msa::TensorView s_v = call.need(seq_lens, "seq_lens");
        const msa::TensorView o_v = call.out(out, "out");
        const msa::RunOptions opts{0.0f, call.stream(stream, req_to_token, r_v), validate};
        nb::gil_scoped_release nogil;
        msa::build_page_table(r_v, i_v, s_v, page_size, o_v, opts);
      },
      "req_to_token"_a.none(), "req_pool_indices"_a.none(), "seq_lens"_a.none(), "page_size"_a, "out"_a, "validate"_a = false,
      "stream"_a = 0,
      "Binding of msa::build_page_table; use msa.build_page_table.");

  m.def(
      "write_cache",
      [](nb::handle src, nb::handle cache, nb::handle slot_ids, float scale, nb::handle slot_scale, bool validate,
         int64_t stream) {
        Call call("msa.write_cache");
        const msa::TensorView src_v = call.need(src, "src"), ids_v = call.need(slot_ids, "slot_ids");
        const msa::TensorView cache_v = call.need(cache, "cache", /*writable=*/true), ss_v = call.out(slot_scale, "slot_scale");
        const msa::RunOptions opts{0.0f, call.stream(stream, src, src_v), validate};
        nb::gil_scoped_release nogil;
        msa::write_cache(src_v, cache_v, ids_v, scale, ss_v, opts);
      },
      "src"_a.none(), "cache"_a.none(), "slot_ids"_a.none(), "scale"_a, "slot_scale"_a.none(), "validate"_a, "stream"_a = 0,
      "Binding of msa::write_cache; use msa.write_cache.");

  m.def(
      "_set_fast_import",
      [](bool on) {
        const bool was = g_fast_import;
        g_fast_import = on;
        return was;
      },
      "on"_a,
      "Whether tensors are imported through their type's DLPack C exchange API where it has one (default), or "
      "always through __dlpack__; returns the previous setting. For tests and benchmarks.");
  m.def(
      "_current_stream_through_api",
      [](nb::handle like) { return g_fast_import && fast_type(Py_TYPE(like.ptr())).api != nullptr; },
      "like"_a,
      "Whether a call can be given the stream -1 for like's framework's current stream, resolved through its type's "
      "DLPack C exchange API (python/msa/_framework.py resolve_stream).");
  m.def("cuda_available", &msa::cuda_available,
        "True when this build has the CUDA backend and its kernels run on the current GPU as sm_80 or newer.");
  m.def("cuda_compute_capability", &msa::cuda_compute_capability,
        "The compute capability (major * 10 + minor) msa's kernels run as on the current GPU: the GPU's own, or "
        "lower where this build holds only older code for it (a build for sm_80 on an H200: 80); 0 without one.");
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "msa C++ bindings (DLPack tensors in, msa entry points out). Use the msa package, not this module.";
  // Plans held by module globals (user code, msa.torch_ops' handle registry) are still alive when the
  // interpreter tears this module down; nanobind would report each as a leak at exit.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const msa::Error& e) {
      PyErr_SetString(exception_type(e.kind()), e.what());
    }
  });
  bind_plan(m);
  bind_plans(m);
  bind_ops(m);
}
