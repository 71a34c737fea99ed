// The front door of the KV-cache writer (msa::write_cache): checks the arguments (contract §6, §7), turns
// them into WriteCacheParams and dispatches on the device. The slot ids' values are checked where they are
// host-readable (CPU tensors always, CUDA tensors with RunOptions::validate); the GPU kernel skips a slot
// outside the cache whatever the values.
#include <cmath>

#include "core/backend.h"
#include "core/checks.h"
#include "msa/error.h"
#include "msa/ops.h"

namespace msa {

using namespace detail;

namespace {

constexpr std::initializer_list<DType> kGpuSrc{DType::kBF16, DType::kF16};
constexpr std::initializer_list<DType> kCpuSrc{DType::kBF16, DType::kF16, DType::kF32};

void check_scales(const char* fn, const TensorView& cache, float scale, const TensorView& slot_scale) {
  const bool fp8 = cache.dtype() == DType::kF8E4M3;
  MSA_CHECK(std::isfinite(scale) && scale > 0.f, kValue, fn,
            ": argument 'scale': expected a finite number > 0, got ", scale);
  if (!fp8) {
    MSA_CHECK(scale == 1.f, kValue, fn, ": argument 'scale': only used with a float8_e4m3fn cache (a ",
              cache.dtype_str(), " cache is a plain copy), expected 1, got ", scale);
    MSA_CHECK(!slot_scale.defined(), kValue, fn, ": argument 'slot_scale': only used with a float8_e4m3fn cache, ",
              "got a ", cache.dtype_str(), " cache");
  } else if (slot_scale.defined()) {
    MSA_CHECK(scale == 1.f, kValue, fn, ": arguments 'scale' and 'slot_scale': expected one of them (a per-tensor ",
              "scale, or per-slot scales computed from the rows), got scale = ", scale, " and slot_scale");
  }
}

}  // namespace

void write_cache(const TensorView& src, const TensorView& cache, const TensorView& slot_ids, float scale,
                 const TensorView& slot_scale, const RunOptions& opts) {
  const char* fn = "msa.write_cache";
  arg(fn, "src", src).present();
  const Device dev = src.device();
  const bool gpu = dev.is_cuda();
  MSA_CHECK(!gpu || cuda::compiled(), kNotImplemented, fn,
            ": CUDA tensors passed, but this build of msa has no CUDA backend (rebuild with nvcc on the PATH)");
  check_dtypes(fn, {{"src", src, gpu ? kGpuSrc : kCpuSrc},
                    {"cache", cache, {src.dtype(), DType::kF8E4M3}, "the dtype of src, or float8_e4m3fn"},
                    {"slot_ids", slot_ids, {DType::kI32, DType::kI64}},
                    {"slot_scale", slot_scale, {DType::kF32}}});
  arg(fn, "src", src).ndim(3, "[num_tokens, num_heads, head_dim]").inner_contiguous().nonneg_strides();
  const int64_t n = src.size(0), H = src.size(1), D = src.size(2);
  arg(fn, "cache", cache).present().ndim(4, "[num_pages, num_heads, page_size, head_dim]").device(dev)
      .size(1, H, "num_heads, as src").size(3, D, "head_dim, as src").inner_contiguous().nonneg_strides();
  arg(fn, "slot_ids", slot_ids).present().ndim(1, "[num_tokens]").device(dev).size(0, n, "num_tokens, as src")
      .nonneg_strides();
  check_scales(fn, cache, scale, slot_scale);
  if (slot_scale.defined())
    arg(fn, "slot_scale", slot_scale).present().ndim(3, "[num_pages, num_heads, page_size]").device(dev)
        .size(0, cache.size(0), "num_pages, as cache").size(1, H, "num_heads").size(2, cache.size(2), "page_size")
        .nonneg_strides();

  WriteCacheParams p;
  p.src_dtype = scalar_type(src.dtype());
  p.cache_dtype = scalar_type(cache.dtype());
  p.src = src.data();
  p.src_stride_token = src.stride(0);
  p.src_stride_head = src.stride(1);
  p.num_tokens = n;
  p.num_heads = static_cast<int32_t>(H);
  p.dim = static_cast<int32_t>(D);
  p.cache = cache.data();
  p.stride_page = cache.stride(0);
  p.stride_head = cache.stride(1);
  p.stride_token = cache.stride(2);
  p.num_pages = cache.size(0);
  p.page_size = static_cast<int32_t>(cache.size(2));
  p.slots = slot_ids.data();
  p.slots_i64 = slot_ids.dtype() == DType::kI64;
  p.slot_stride = slot_ids.stride(0);
  p.scale = scale;
  if (slot_scale.defined()) {
    p.slot_scale = slot_scale.data_as<float>();
    p.ss_stride_page = slot_scale.stride(0);
    p.ss_stride_head = slot_scale.stride(1);
    p.ss_stride_token = slot_scale.stride(2);
  }
  const int64_t capacity = p.num_pages * p.page_size;
  if (!gpu || opts.validate) {
    HostInts slots(slot_ids, opts.stream);
    for (int64_t i = 0; i < n; ++i)
      MSA_CHECK(slots.at(i) < capacity, kValue, fn, ": argument 'slot_ids': entry ", i, ": expected a slot in [0, ",
                capacity, ") (num_pages * page_size of the cache), or < 0 to skip the row, got ", slots.at(i));
  }
  if (n == 0 || H == 0 || D == 0) return;
  if (gpu)
    cuda::write_cache(p, opts.stream);
  else
    reference::write_cache(p);
}

}  // namespace msa
