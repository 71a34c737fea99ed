#include "test_util.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

namespace msa_test {

namespace {
constexpr int kBlock = 128;
constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

// ---- encodings ----

uint16_t bf16_bits(double v) {
  if (std::isnan(v)) return 0x7fc0;
  // Round to 8 significant bits directly from the double (no double rounding through float);
  // below 2^-126 the format is fixed-point with step 2^-133.
  double r;
  if (v == 0.0 || std::isinf(v)) {
    r = v;
  } else {
    int e;
    std::frexp(v, &e);  // |v| = m * 2^e, m in [0.5, 1)
    const int step = std::max(e - 8, -133);
    r = std::ldexp(std::nearbyint(std::ldexp(v, -step)), step);
  }
  const float f = static_cast<float>(r);  // exact (or inf past the largest bf16)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t fp16_bits(double v) {
  const _Float16 h = static_cast<_Float16>(v);  // the compiler's correctly rounded conversion
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

double fp8e4m3_value(uint8_t bits) {
  const int sign = bits >> 7, exp = (bits >> 3) & 15, mant = bits & 7;
  if (exp == 15 && mant == 7) return std::nan("");
  const double mag = exp == 0 ? mant / 8.0 * std::pow(2.0, -6) : (1.0 + mant / 8.0) * std::pow(2.0, exp - 7);
  return sign ? -mag : mag;
}

uint8_t fp8e4m3_bits(double v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  if (std::isnan(v) || a >= 480.0) return sign | 0x7f;
  // Nearest of the 127 magnitudes, with 480 standing in for code 0x7f (NaN): what rounds there overflows.
  static const std::array<double, 128> magnitudes = [] {
    std::array<double, 128> m{};
    for (int code = 0; code < 0x7f; ++code) m[code] = fp8e4m3_value(static_cast<uint8_t>(code));
    m[0x7f] = 480.0;
    return m;
  }();
  int best = 0;
  double best_err = kInf;
  for (int code = 0; code <= 0x7f; ++code) {
    const double m = magnitudes[code];
    const double err = std::fabs(a - m);
    if (err < best_err || (err == best_err && code % 2 == 0)) best = code, best_err = err;
  }
  return sign | static_cast<uint8_t>(best);
}

double decode(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: {
      _Float16 h;
      std::memcpy(&h, static_cast<const uint16_t*>(base) + i, 2);
      return static_cast<double>(h);
    }
    case DType::kBF16: {
      const uint32_t u = uint32_t(static_cast<const uint16_t*>(base)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DType::kF8E4M3: return fp8e4m3_value(static_cast<const uint8_t*>(base)[i]);
    case DType::kI32: return static_cast<const int32_t*>(base)[i];
    default: ADD_FAILURE() << "decode: unsupported dtype"; return 0;
  }
}

void encode(DType t, void* base, int64_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = static_cast<float>(v); return;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = fp16_bits(v); return;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = bf16_bits(v); return;
    case DType::kF8E4M3: static_cast<uint8_t*>(base)[i] = fp8e4m3_bits(v); return;
    case DType::kI32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); return;
    default: ADD_FAILURE() << "encode: unsupported dtype";
  }
}

// ---- buffers and views ----

Buffer::Buffer(DType dtype, int64_t numel)
    : dtype_(dtype), numel_(numel), words_(static_cast<size_t>((numel * msa::dtype_bytes(dtype) + 7) / 8 + 1)) {}

void Buffer::fill(double v) {
  for (int64_t i = 0; i < numel_; ++i) set(i, v);
}

TensorView Buffer::view(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) const {
  return view_at(0, shape, strides);
}

TensorView Buffer::view_at(int64_t offset, const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& strides) const {
  return TensorView(static_cast<char*>(data()) + offset * msa::dtype_bytes(dtype_), dtype_,
                    static_cast<int>(shape.size()), shape.data(), strides.empty() ? nullptr : strides.data());
}

TensorView int_view(const std::vector<int32_t>& v) {
  return TensorView(const_cast<int32_t*>(v.data()), DType::kI32, {static_cast<int64_t>(v.size())});
}

IndexRows::IndexRows(int64_t tokens_, int64_t heads_, int64_t topk_, bool head_major_)
    : tokens(tokens_), heads(heads_), topk(topk_), head_major(head_major_),
      mem(static_cast<size_t>(tokens_ * heads_ * topk_), -1) {}

int64_t IndexRows::offset(int64_t t, int64_t h, int64_t i) const {
  return head_major ? (h * tokens + t) * topk + i : (t * heads + h) * topk + i;
}

TensorView IndexRows::view() const {
  auto* p = const_cast<int32_t*>(mem.data());
  if (head_major) return TensorView(p, DType::kI32, {tokens, heads, topk}, {topk, tokens * topk, 1});
  return TensorView(p, DType::kI32, {tokens, heads, topk});
}

// ---- problem ----

TensorView Problem::q_view() const {
  return q.view({total_q, spec.num_qo_heads, spec.head_dim});
}
TensorView Problem::k_view() const { return k.view(kv_shape, k_strides); }
TensorView Problem::v_view() const {
  return v_buffer().view_at(v_offset, {kv_shape[0], kv_shape[1], kv_shape[2], dv()}, v_strides);
}
TensorView Problem::k_scale_view() const {
  if (k_scale.numel() == 0) return {};
  return k_scale.view({kv_shape[0], kv_shape[1], kv_shape[2]}, ks_strides);
}
msa::PageTable Problem::page_table() const {
  if (page_indptr.empty())
    return {TensorView(const_cast<int32_t*>(table.data()), DType::kI32, {batch, table_cols}), {}};
  return {int_view(table), int_view(page_indptr)};
}
msa::Sequences Problem::seqs() const {
  return {int_view(qo_indptr), int_view(kv_lens), qo_offset.empty() ? TensorView() : int_view(qo_offset)};
}

void Problem::set_page(int64_t b, int64_t lp, int32_t page) {
  const int64_t at = page_indptr.empty() ? b * table_cols + lp : page_indptr[b] + lp;
  table[at] = page;
  pages_of[b][lp] = page >= 0 && page < num_pages ? page : -1;
}

namespace {

// Strides (elements) of a [pages, H, P, dim] cache in the given layout, and the memory it spans.
std::vector<int64_t> cache_strides(KvLayout layout, int64_t pages, int64_t heads, int64_t P, int64_t dim,
                                   int64_t* numel) {
  switch (layout) {
    case KvLayout::kSlotMajor:
      *numel = pages * P * heads * dim;
      return {P * heads * dim, dim, heads * dim, 1};
    case KvLayout::kPadded: {
      const int64_t pitch = dim + 8, page = heads * P * pitch + 16;
      *numel = pages * page;
      return {page, P * pitch, pitch, 1};
    }
    case KvLayout::kInterleaved:  // a token's K row, then its V row
      *numel = pages * heads * P * 2 * dim;
      return {heads * P * 2 * dim, P * 2 * dim, 2 * dim, 1};
    default:
      *numel = pages * heads * P * dim;
      return {heads * P * dim, P * dim, dim, 1};
  }
}

// Normal values of standard deviation `sigma` for the keys that exist, starting at element `base` of buf;
// the rest is left as it is (NaN from make_problem: spare pages, padding and slots past kv_len).
void fill_cache(const Problem& pr, Buffer& buf, const std::vector<int64_t>& strides, int64_t base, int dim,
                double sigma, Rng& rng) {
  const int P = pr.spec.page_size;
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t j = 0; j < pr.kv_lens[b]; ++j) {
      const int64_t page = pr.pages_of[b][j / P];
      for (int h = 0; h < pr.kv_shape[1]; ++h)
        for (int d = 0; d < dim; ++d)
          buf.set(base + page * strides[0] + h * strides[1] + (j % P) * strides[2] + d, sigma * rng.normal());
    }
}

}  // namespace

IndexRows random_rows(const Problem& pr, int64_t heads, int topk, bool head_major, double empty_row_prob, Rng& rng) {
  IndexRows rows(pr.total_q, heads, topk, head_major);
  std::vector<int32_t> slots(topk);
  std::iota(slots.begin(), slots.end(), 0);
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t nblk = ceil_div(pr.kv_lens[b], kBlock);
    for (int64_t i = 0; i < pr.qo_len(b); ++i) {
      const int64_t t = pr.qo_indptr[b] + i, pos = pr.position(b, i);
      for (int64_t g = 0; g < heads; ++g) {
        if (nblk == 0 || rng.uniform() < empty_row_prob) continue;
        const int64_t own = pr.spec.causal ? std::min<int64_t>(pos / kBlock, nblk - 1) : rng.randint(0, nblk - 1);
        std::vector<int32_t> others;
        for (int32_t blk = 0; blk < nblk; ++blk)
          if (blk != own) others.push_back(blk);
        rng.shuffle(others);
        const int64_t count = rng.randint(1, std::min<int64_t>(topk, nblk));
        rng.shuffle(slots);
        rows.at(t, g, slots[0]) = static_cast<int32_t>(own);
        for (int64_t c = 1; c < count; ++c) rows.at(t, g, slots[c]) = others[c - 1];
      }
    }
  }
  return rows;
}

Problem make_problem(const ProblemSpec& spec) {
  Problem pr;
  pr.spec = spec;
  Rng rng(spec.seed);
  pr.batch = static_cast<int64_t>(spec.qo_lens.size());
  pr.kv_lens = spec.kv_lens;
  pr.qo_offset = spec.qo_offset;
  pr.qo_indptr.assign(1, 0);
  int max_qo = 0;
  int64_t max_kv = 1;
  for (int32_t ql : spec.qo_lens) {
    pr.qo_indptr.push_back(pr.qo_indptr.back() + ql);
    max_qo = std::max(max_qo, ql);
  }
  for (int32_t kl : spec.kv_lens) max_kv = std::max<int64_t>(max_kv, kl);
  pr.total_q = spec.decode ? pr.batch * std::max(max_qo, 1) : pr.qo_indptr.back();

  // Pages: each request's logical pages take physical ids from a shuffled pool with spare pages.
  const int P = spec.page_size;
  int64_t used = 0;
  for (int32_t kl : spec.kv_lens) used += ceil_div(kl, P);
  pr.num_pages = static_cast<int32_t>(used + 3);
  std::vector<int32_t> ids(pr.num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  rng.shuffle(ids);
  size_t next = 0;
  int64_t max_need = 0;
  pr.pages_of.resize(pr.batch);
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t need = ceil_div(spec.kv_lens[b], P);
    max_need = std::max(max_need, need);
    for (int64_t lp = 0; lp < need; ++lp) pr.pages_of[b].push_back(ids[next++]);
  }
  if (spec.flat_table) {
    // One junk entry before the first row and an unused trailing entry on odd rows: rows are found by indptr.
    pr.table.push_back(-1);
    pr.page_indptr.push_back(1);
    for (int64_t b = 0; b < pr.batch; ++b) {
      pr.table.insert(pr.table.end(), pr.pages_of[b].begin(), pr.pages_of[b].end());
      if (b % 2) pr.table.push_back(ids[rng.randint(0, pr.num_pages - 1)]);
      pr.page_indptr.push_back(static_cast<int32_t>(pr.table.size()));
    }
  } else {
    pr.table_cols = max_need + 1;
    pr.table.assign(static_cast<size_t>(pr.batch * pr.table_cols), -1);
    for (int64_t b = 0; b < pr.batch; ++b)
      std::copy(pr.pages_of[b].begin(), pr.pages_of[b].end(), pr.table.begin() + b * pr.table_cols);
  }

  // q, then the caches.
  const int D = spec.head_dim, Dv = pr.dv(), Hkv = spec.num_kv_heads;
  pr.q = Buffer(spec.dtype, pr.total_q * spec.num_qo_heads * D);
  for (int64_t i = 0; i < pr.q.numel(); ++i) pr.q.set(i, rng.normal());
  pr.kv_shape = {pr.num_pages, Hkv, P, D};
  int64_t numel = 0;
  const DType k_dtype = spec.fp8_kv ? DType::kF8E4M3 : spec.k_dtype == DType::kUnknown ? spec.dtype : spec.k_dtype;
  const DType v_dtype = spec.fp8_kv ? DType::kF8E4M3 : spec.dtype;
  // fp8: stored values / scale, so that the dequantized values are unit-normal.
  const double k_sigma = spec.fp8_kv ? 1.0 / spec.k_scale : 1.0, v_sigma = spec.fp8_kv ? 1.0 / spec.v_scale : 1.0;
  pr.k_strides = cache_strides(spec.kv_layout, pr.num_pages, Hkv, P, D, &numel);
  pr.k = Buffer(k_dtype, numel);
  pr.k.fill(std::nan(""));
  fill_cache(pr, pr.k, pr.k_strides, 0, D, k_sigma, rng);
  pr.v_strides = cache_strides(spec.kv_layout, pr.num_pages, Hkv, P, Dv, &numel);
  if (spec.kv_layout == KvLayout::kInterleaved) {
    EXPECT_EQ(D, Dv) << "an interleaved pool holds K and V rows of one width";
    EXPECT_EQ(k_dtype, v_dtype) << "an interleaved pool holds K and V of one dtype";
    pr.v_offset = D;
    fill_cache(pr, pr.k, pr.v_strides, pr.v_offset, Dv, v_sigma, rng);
  } else {
    pr.v = Buffer(v_dtype, numel);
    pr.v.fill(std::nan(""));
    fill_cache(pr, pr.v, pr.v_strides, 0, Dv, v_sigma, rng);
  }
  if (spec.k_dtype == DType::kF8E4M3) {  // the indexer's per-token scales
    pr.k_scale = Buffer(DType::kF32, int64_t(pr.num_pages) * Hkv * P);
    for (int64_t i = 0; i < pr.k_scale.numel(); ++i) pr.k_scale.set(i, rng.uniform(0.25, 2.0));
    pr.ks_strides = {Hkv * P, P, 1};
  }

  if (spec.topk > 0) pr.rows = random_rows(pr, Hkv, spec.topk, spec.head_major_index, spec.empty_row_prob, rng);

  msa::AttentionConfig cfg;
  cfg.num_qo_heads = spec.num_qo_heads;
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = D;
  cfg.head_dim_v = spec.head_dim_v;
  cfg.page_size = P;
  cfg.topk = spec.topk;
  cfg.causal = spec.causal;
  pr.plan = spec.decode ? msa::plan_decode(cfg, {}, static_cast<int>(pr.batch), std::max(max_qo, 1), max_kv)
                        : msa::plan_prefill(cfg, {}, spec.qo_lens, spec.kv_lens, spec.qo_offset);
  return pr;
}

// ---- running and checking ----

AttnResult run_attention(const Problem& pr, const IndexRows* rows, const msa::RunOptions& opts) {
  const int64_t H = pr.spec.num_qo_heads, Dv = pr.dv(), T = pr.total_q;
  const int64_t pad = pr.spec.strided_out ? 8 : 0;
  AttnResult r;
  r.o_strides = {H * Dv + pad, Dv};
  r.o = Buffer(pr.spec.dtype, T * r.o_strides[0]);
  r.o.fill(std::nan(""));
  r.lse_stride = H + (pad ? 1 : 0);
  r.lse.assign(static_cast<size_t>(T * r.lse_stride), std::nanf(""));
  const TensorView o = r.o.view({T, H, Dv}, {r.o_strides[0], r.o_strides[1], 1});
  const TensorView lse(r.lse.data(), DType::kF32, {T, H}, {r.lse_stride, 1});
  if (!rows && pr.spec.topk > 0) rows = &pr.rows;
  msa::RunOptions scaled = opts;
  scaled.q_scale = static_cast<float>(pr.spec.q_scale);
  scaled.k_scale = static_cast<float>(pr.spec.k_scale);
  scaled.v_scale = static_cast<float>(pr.spec.v_scale);
  msa::attention(pr.plan, pr.q_view(), pr.k_view(), pr.v_view(), pr.page_table(), pr.seqs(),
                 rows ? rows->view() : TensorView(), o, lse, scaled);
  return r;
}

namespace {
std::vector<double> as_doubles(const Buffer& b) {
  std::vector<double> v(static_cast<size_t>(b.numel()));
  for (int64_t i = 0; i < b.numel(); ++i) v[i] = b.get(i);
  return v;
}
}  // namespace

Expected naive_attention(const Problem& pr, const IndexRows* rows, double sm_scale, int64_t token_step) {
  if (!rows && pr.spec.topk > 0) rows = &pr.rows;
  const std::vector<double> q = as_doubles(pr.q), k = as_doubles(pr.k), v = as_doubles(pr.v_buffer());
  const int64_t H = pr.spec.num_qo_heads, D = pr.spec.head_dim, Dv = pr.dv(), P = pr.spec.page_size;
  const int64_t group = H / pr.spec.num_kv_heads;
  // The scales as the float RunOptions carries them.
  const double q_scale = static_cast<float>(pr.spec.q_scale), k_scale = static_cast<float>(pr.spec.k_scale),
               v_scale = static_cast<float>(pr.spec.v_scale);
  const double scale = (sm_scale > 0 ? sm_scale : 1.0 / std::sqrt(static_cast<double>(D))) * q_scale;
  Expected e;
  e.o.assign(static_cast<size_t>(pr.total_q * H * Dv), 0.0);
  e.lse.assign(static_cast<size_t>(pr.total_q * H), -kInf);
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t kv = pr.kv_lens[b], nblk = ceil_div(kv, kBlock);
    for (int64_t i = 0; i < pr.qo_len(b); ++i) {
      const int64_t t = pr.qo_indptr[b] + i, pos = pr.position(b, i);
      if (t % token_step) continue;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / group;
        std::set<int64_t> selected;
        if (rows)
          for (int64_t s = 0; s < rows->topk; ++s) {
            const int64_t blk = rows->at(t, g, s);
            if (blk >= 0 && blk < nblk) selected.insert(blk);
          }
        std::vector<int64_t> keys;  // element offsets of the visible keys' V rows
        std::vector<double> scores;
        for (int64_t j = 0; j < kv; ++j) {
          if (pr.spec.causal && j > pos) break;
          if (rows && !selected.count(j / kBlock)) continue;
          const int64_t page = pr.pages_of[b][j / P];
          if (page < 0) continue;
          double dot = 0;
          const int64_t koff = page * pr.k_strides[0] + g * pr.k_strides[1] + (j % P) * pr.k_strides[2];
          for (int64_t d = 0; d < D; ++d) dot += q[(t * H + h) * D + d] * (k[koff + d] * k_scale);
          keys.push_back(pr.v_offset + page * pr.v_strides[0] + g * pr.v_strides[1] + (j % P) * pr.v_strides[2]);
          scores.push_back(dot * scale);
        }
        if (keys.empty()) continue;
        const double m = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double s : scores) sum += std::exp(s - m);
        for (size_t n = 0; n < keys.size(); ++n) {
          const double w = std::exp(scores[n] - m) / sum;
          for (int64_t d = 0; d < Dv; ++d) e.o[(t * H + h) * Dv + d] += w * (v[keys[n] + d] * v_scale);
        }
        e.lse[t * H + h] = m + std::log(sum);
      }
    }
  }
  return e;
}

Tolerance tolerance_for(DType t) {
  // bf16/fp16: the contract's bars (output rounding alone is ~2^-9 relative). fp32: accumulation
  // error of fp32 sums over ~1e3 keys, about 1e-6.
  // lse: both sides see the same quantized inputs, so only fp32 dot products differ (~1e-6 measured).
  if (t == DType::kF32) return {1e-5, 1e-5, 2e-5};
  return {1e-2, 2e-2, 2e-5};
}

void expect_attention_matches(const Problem& pr, const AttnResult& got, const Expected& ref, int64_t token_step) {
  const Tolerance tol = tolerance_for(pr.spec.dtype);
  const int64_t H = pr.spec.num_qo_heads, Dv = pr.dv();
  double err2 = 0, ref2 = 0, max_abs = 0, lse_err = 0;
  int64_t nans = 0, inf_mismatch = 0, empty_nonzero = 0;
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t t = pr.qo_indptr[b]; t < pr.qo_indptr[b + 1]; ++t)
      for (int64_t h = 0; h < H && t % token_step == 0; ++h) {
        const double rl = ref.lse[t * H + h], gl = got.lse_at(t, h);
        const bool empty = rl == -kInf;
        if (std::isnan(gl)) ++nans;
        else if (empty != (gl == -kInf)) ++inf_mismatch;
        else if (!empty) lse_err = std::max(lse_err, std::fabs(gl - rl));
        for (int64_t d = 0; d < Dv; ++d) {
          const double x = got.o_at(t, h, d), y = ref.o[(t * H + h) * Dv + d];
          if (std::isnan(x)) {
            ++nans;
            continue;
          }
          if (empty && x != 0.0) ++empty_nonzero;
          err2 += (x - y) * (x - y);
          ref2 += y * y;
          max_abs = std::max(max_abs, std::fabs(x - y));
        }
      }
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  EXPECT_EQ(nans, 0) << "NaN in o or lse";
  EXPECT_EQ(inf_mismatch, 0) << "rows where exactly one of (result, reference) has lse = -inf";
  EXPECT_EQ(empty_nonzero, 0) << "rows with no visible key must have o = 0";
  EXPECT_LT(rel, tol.rel_l2) << "relative L2 error of o";
  EXPECT_LT(max_abs, tol.max_abs) << "max abs error of o";
  EXPECT_LT(lse_err, tol.lse_abs) << "max abs error of lse";
}

void expect_msa_error(const std::function<void()>& fn, msa::ErrorKind kind, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const msa::Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << "message: " << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
        << "message lacks \"" << n << "\": " << e.what();
    return;
  }
  ADD_FAILURE() << "no msa::Error thrown";
}

void expect_padding_rows_empty(const Problem& pr, const AttnResult& got) {
  for (int64_t t = pr.qo_indptr.back(); t < pr.total_q; ++t)
    for (int64_t h = 0; h < pr.spec.num_qo_heads; ++h) {
      EXPECT_EQ(got.lse_at(t, h), -std::numeric_limits<double>::infinity());
      for (int d = 0; d < pr.dv(); ++d) EXPECT_EQ(got.o_at(t, h, d), 0.0);
    }
}

}  // namespace msa_test
