// The KV-cache writer on the CPU backend (contract §7): copies and e4m3 quantization into paged caches of
// every layout, slots in any order, negative slots skipped, the scales, the round trip through
// block_scores' fp8 path, and the argument errors.
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "test_util.h"

namespace msa_test {
namespace {

using msa::ErrorKind;

constexpr uint8_t kPoison8 = 0x5a;

// A paged cache [pages, H, P, D] inside a byte pool, in one of the layouts engines use.
enum class Pool { kSeparate, kSlotMajor, kInterleavedK, kInterleavedV };

struct Cache {
  DType dtype;
  int64_t pages, H, P, D;
  std::vector<int64_t> strides;  // elements
  int64_t base = 0;              // element offset of the view in the pool (the V half of an interleaved pool)
  std::vector<uint8_t> mem;

  Cache(DType dt, Pool pool, int64_t pages_, int64_t H_, int64_t P_, int64_t D_)
      : dtype(dt), pages(pages_), H(H_), P(P_), D(D_) {
    int64_t numel = pages * H * P * D;
    switch (pool) {
      case Pool::kSeparate: strides = {H * P * D, P * D, D, 1}; break;
      case Pool::kSlotMajor: strides = {P * H * D, D, H * D, 1}; break;  // [slots, H, D] as [pages, H, P, D]
      case Pool::kInterleavedK: case Pool::kInterleavedV:                // halves of [pages, H, P, 2D]
        strides = {H * P * 2 * D, P * 2 * D, 2 * D, 1};
        numel *= 2;
        base = pool == Pool::kInterleavedV ? D : 0;
        break;
    }
    mem.assign(static_cast<size_t>(numel * msa::dtype_bytes(dt)), kPoison8);
  }
  int eb() const { return msa::dtype_bytes(dtype); }
  TensorView view() const {
    const std::vector<int64_t> shape = {pages, H, P, D};
    return TensorView(const_cast<uint8_t*>(mem.data()) + base * eb(), dtype, 4, shape.data(), strides.data());
  }
  // Byte offset of element (slot, h, d).
  int64_t byte_at(int64_t slot, int64_t h, int64_t d) const {
    return (base + (slot / P) * strides[0] + h * strides[1] + (slot % P) * strides[2] + d) * eb();
  }
};

// Per-slot scales [pages, H, P] with padded strides, poisoned.
struct SlotScales {
  int64_t pages, H, P;
  std::vector<float> mem;
  SlotScales(int64_t pages_, int64_t H_, int64_t P_)
      : pages(pages_), H(H_), P(P_), mem(static_cast<size_t>(pages * H * (P + 3)), -7.f) {}
  TensorView view() const {
    return TensorView(const_cast<float*>(mem.data()), DType::kF32, {pages, H, P}, {H * (P + 3), P + 3, 1});
  }
  float at(int64_t slot, int64_t h) const { return mem[(slot / P) * H * (P + 3) + h * (P + 3) + slot % P]; }
};

// src [n, H, D] with a padded token stride; some specials among normal values.
Buffer make_src(DType dt, int64_t n, int64_t H, int64_t D, double spread, Rng& rng, bool specials) {
  Buffer b(dt, n * H * (D + 8));
  for (int64_t i = 0; i < b.numel(); ++i) b.set(i, rng.normal() * spread);
  if (specials && n > 0) {
    const double vals[] = {std::nan(""), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(), 1e4, -1e4, 0.0, -0.0, 1e-6, -3e-3};
    int k = 0;
    for (double v : vals) b.set((k++ * 7) % (n * H * (D + 8)), v);
  }
  return b;
}
TensorView src_view(const Buffer& b, int64_t n, int64_t H, int64_t D) { return b.view({n, H, D}, {H * (D + 8), D + 8, 1}); }
double src_at(const Buffer& b, int64_t H, int64_t D, int64_t i, int64_t h, int64_t d) {
  return b.get(i * H * (D + 8) + h * (D + 8) + d);
}

// The writer's e4m3 byte of x / scale, from the independent encoder: the quotient in fp32, saturated.
uint8_t expected_e4m3(double x, float scale) {
  const float q = static_cast<float>(x) / scale;
  if (std::isnan(q)) return 0x7f;
  return fp8e4m3_bits(std::fmin(std::fmax(static_cast<double>(q), -448.0), 448.0));
}

float expected_row_scale(const Buffer& b, int64_t H, int64_t D, int64_t i, int64_t h) {
  float amax = 0.f;
  for (int64_t d = 0; d < D; ++d) {
    const float x = static_cast<float>(src_at(b, H, D, i, h, d));
    if (std::isfinite(x)) amax = std::fmax(amax, std::fabs(x));
  }
  return amax / 448.f > 0.f ? amax / 448.f : 1.f;
}

// Slot ids for n tokens: distinct slots of the cache in shuffled order, every 5th one negative (padding).
std::vector<int64_t> make_slots(int64_t n, int64_t capacity, Rng& rng) {
  std::vector<int64_t> all(static_cast<size_t>(capacity));
  std::iota(all.begin(), all.end(), 0);
  rng.shuffle(all);
  std::vector<int64_t> s(all.begin(), all.begin() + n);
  for (int64_t i = 4; i < n; i += 5) s[i] = -1 - i;
  return s;
}

struct Case {
  DType src, cache;
  Pool pool;
  bool slot_scales = false;
  float scale = 1.f;
  bool i64 = false;
  int64_t n = 37, H = 2, P = 16, pages = 5, D = 64;
};

void check_write(const Case& c, uint64_t seed) {
  Rng rng(seed);
  const Buffer src = make_src(c.src, c.n, c.H, c.D, c.slot_scales ? 3.0 : 40.0, rng, true);
  Cache cache(c.cache, c.pool, c.pages, c.H, c.P, c.D);
  SlotScales ss(c.pages, c.H, c.P);
  const std::vector<int64_t> slots = make_slots(c.n, c.pages * c.P, rng);
  std::vector<int32_t> slots32(slots.begin(), slots.end());
  const TensorView ids = c.i64 ? TensorView(const_cast<int64_t*>(slots.data()), DType::kI64, {c.n})
                               : TensorView(slots32.data(), DType::kI32, {c.n});
  msa::write_cache(src_view(src, c.n, c.H, c.D), cache.view(), ids, c.scale,
                   c.slot_scales ? ss.view() : TensorView());

  std::vector<uint8_t> expected(cache.mem.size(), kPoison8);
  std::vector<bool> scale_written(ss.mem.size(), false);
  for (int64_t i = 0; i < c.n; ++i) {
    if (slots[i] < 0) continue;
    for (int64_t h = 0; h < c.H; ++h) {
      const float scale = c.slot_scales ? expected_row_scale(src, c.H, c.D, i, h) : c.scale;
      if (c.slot_scales) {
        EXPECT_EQ(ss.at(slots[i], h), scale) << "token " << i << " head " << h;
        const int64_t at = (slots[i] / c.P) * c.H * (c.P + 3) + h * (c.P + 3) + slots[i] % c.P;
        scale_written[at] = true;
      }
      for (int64_t d = 0; d < c.D; ++d) {
        const double x = src_at(src, c.H, c.D, i, h, d);
        const int64_t at = cache.byte_at(slots[i], h, d);
        if (c.cache == DType::kF8E4M3) {
          expected[at] = expected_e4m3(x, scale);
        } else {
          Buffer one(c.src, 1);
          one.set(0, x);
          std::memcpy(&expected[at], one.data(), cache.eb());
        }
      }
    }
  }
  int64_t bad = 0;
  for (size_t b = 0; b < expected.size() && bad < 10; ++b)
    if (expected[b] != cache.mem[b]) {
      ++bad;
      ADD_FAILURE() << "cache byte " << b << ": expected 0x" << std::hex << int(expected[b]) << ", got 0x"
                    << int(cache.mem[b]);
    }
  for (size_t k = 0; k < ss.mem.size(); ++k)
    if (!scale_written[k]) EXPECT_EQ(ss.mem[k], -7.f) << "slot_scale element " << k << " written";
}

TEST(WriteCache, CopyBf16SeparatePool) { check_write({DType::kBF16, DType::kBF16, Pool::kSeparate}, 1); }
TEST(WriteCache, CopyFp16SlotMajorInt64Slots) {
  Case c{DType::kF16, DType::kF16, Pool::kSlotMajor};
  c.i64 = true;
  check_write(c, 2);
}
TEST(WriteCache, CopyFp32InterleavedHalves) {
  check_write({DType::kF32, DType::kF32, Pool::kInterleavedK}, 3);
  check_write({DType::kF32, DType::kF32, Pool::kInterleavedV}, 4);
}
TEST(WriteCache, Fp8PerTensorScale) {
  for (DType src : {DType::kBF16, DType::kF16, DType::kF32}) {
    Case c{src, DType::kF8E4M3, Pool::kSeparate};
    c.scale = 0.37f;
    check_write(c, 5);
  }
}
TEST(WriteCache, Fp8SlotMajorAndInterleaved) {
  for (Pool pool : {Pool::kSlotMajor, Pool::kInterleavedK, Pool::kInterleavedV}) {
    Case c{DType::kBF16, DType::kF8E4M3, pool};
    c.scale = 2.5f;
    c.D = 40;  // not a multiple of 16
    check_write(c, 6);
  }
}
TEST(WriteCache, Fp8UnitScaleSaturates) {
  Case c{DType::kF16, DType::kF8E4M3, Pool::kSeparate};  // spread 40: many values past 448 after specials
  c.scale = 0.05f;
  check_write(c, 7);
}
TEST(WriteCache, Fp8PerSlotScales) {
  for (DType src : {DType::kBF16, DType::kF16, DType::kF32})
    for (Pool pool : {Pool::kSeparate, Pool::kSlotMajor}) {
      Case c{src, DType::kF8E4M3, pool, true};
      c.H = 1;
      c.D = 128;
      check_write(c, 8);
    }
}

TEST(WriteCache, AllZeroRowGetsScaleOne) {
  Buffer src(DType::kBF16, 2 * 16);
  src.fill(0.0);
  src.set(16 + 3, -448.0 * 3);  // row 1: amax 1344, scale 3
  Cache cache(DType::kF8E4M3, Pool::kSeparate, 1, 1, 4, 16);
  SlotScales ss(1, 1, 4);
  std::vector<int32_t> slots = {2, 0};
  msa::write_cache(src.view({2, 1, 16}), cache.view(), int_view(slots), 1.f, ss.view());
  EXPECT_EQ(ss.at(2, 0), 1.f);
  EXPECT_EQ(ss.at(0, 0), 3.f);
  EXPECT_EQ(cache.mem[cache.byte_at(0, 0, 3)], 0xfe);  // -448
  for (int d = 0; d < 16; ++d) EXPECT_EQ(cache.mem[cache.byte_at(2, 0, d)], 0) << d;
}

// Keys quantized by the writer score in block_scores' fp8 path exactly as their dequantized values
// (e4m3 value x scale, in fp32) score as fp32 keys.
TEST(WriteCache, IndexKeysRoundTripThroughBlockScores) {
  Rng rng(11);
  const int64_t T = 3, H = 4, Hk = 1, D = 128, P = 64, pages = 6, kv = 300;
  Buffer q(DType::kF32, T * H * D);
  for (int64_t i = 0; i < q.numel(); ++i) q.set(i, rng.normal());
  Buffer keys(DType::kBF16, kv * Hk * D);
  for (int64_t i = 0; i < keys.numel(); ++i) keys.set(i, rng.normal() * (1 + (i / D) % 7));
  std::vector<int32_t> page_of = {4, 1, 5, 0, 2};  // logical -> physical
  std::vector<int32_t> slots(kv);
  for (int64_t j = 0; j < kv; ++j) slots[j] = page_of[j / P] * P + j % P;
  Cache k8(DType::kF8E4M3, Pool::kSlotMajor, pages, Hk, P, D);
  SlotScales ks(pages, Hk, P);
  msa::write_cache(keys.view({kv, Hk, D}), k8.view(), int_view(slots), 1.f, ks.view());

  Cache k32(DType::kF32, Pool::kSeparate, pages, Hk, P, D);
  for (int64_t j = 0; j < kv; ++j)
    for (int64_t d = 0; d < D; ++d) {
      const float v = static_cast<float>(fp8e4m3_value(k8.mem[k8.byte_at(slots[j], 0, d)])) * ks.at(slots[j], 0);
      std::memcpy(&k32.mem[k32.byte_at(slots[j], 0, d)], &v, 4);
    }
  std::vector<int32_t> table = {4, 1, 5, 0, 2}, qo_indptr = {0, T}, kv_lens = {kv};
  const msa::PageTable pt{TensorView(table.data(), DType::kI32, {1, 5}), {}};
  const msa::Sequences seqs{int_view(qo_indptr), int_view(kv_lens), {}};
  const int64_t NB = 3;
  std::vector<float> s8(T * H * NB), s32(T * H * NB);
  const TensorView qv = q.view({T, H, D});
  msa::block_scores(qv, k8.view(), ks.view(), pt, seqs, TensorView(s8.data(), DType::kF32, {T, H, NB}),
                    msa::ScoreLayout::kTHK);
  msa::block_scores(qv, k32.view(), {}, pt, seqs, TensorView(s32.data(), DType::kF32, {T, H, NB}),
                    msa::ScoreLayout::kTHK);
  for (size_t i = 0; i < s8.size(); ++i) EXPECT_EQ(s8[i], s32[i]) << "score " << i;
}

TEST(WriteCache, DuplicateSlotKeepsTheLastRowOnTheCpu) {
  Buffer src(DType::kBF16, 3 * 8);
  for (int64_t i = 0; i < 24; ++i) src.set(i, double(i / 8 + 1));
  Cache cache(DType::kBF16, Pool::kSeparate, 1, 1, 4, 8);
  std::vector<int32_t> slots = {1, 1, -1};
  msa::write_cache(src.view({3, 1, 8}), cache.view(), int_view(slots));
  Buffer got(DType::kBF16, 1);
  std::memcpy(got.data(), &cache.mem[cache.byte_at(1, 0, 0)], 2);
  EXPECT_EQ(got.get(0), 2.0);
}

TEST(WriteCache, EmptyBatchWritesNothing) {
  Buffer src(DType::kBF16, 8);
  Cache cache(DType::kF8E4M3, Pool::kSeparate, 1, 1, 4, 8);
  std::vector<int32_t> slots;
  msa::write_cache(src.view({0, 1, 8}), cache.view(), TensorView(slots.data(), DType::kI32, {0}), 2.f);
  for (uint8_t b : cache.mem) EXPECT_EQ(b, kPoison8);
}

TEST(WriteCache, ArgumentErrors) {
  Buffer src(DType::kBF16, 2 * 2 * 16);
  const TensorView sv = src.view({2, 2, 16});
  Cache bf(DType::kBF16, Pool::kSeparate, 2, 2, 4, 16), f8(DType::kF8E4M3, Pool::kSeparate, 2, 2, 4, 16);
  Cache f16(DType::kF16, Pool::kSeparate, 2, 2, 4, 16);
  SlotScales ss(2, 2, 4), ss_small(2, 2, 3);
  std::vector<int32_t> ok = {0, 7}, past = {3, 8}, three = {0, 1, 2};
  auto fail = [](std::function<void()> fn, ErrorKind kind, std::vector<std::string> needles) {
    needles.insert(needles.begin(), "msa.write_cache");
    expect_msa_error(fn, kind, needles);
  };
  fail([&] { msa::write_cache(sv, bf.view(), int_view(past)); }, ErrorKind::kValue,
       {"'slot_ids'", "entry 1", "[0, 8)", "got 8"});
  fail([&] { msa::write_cache(sv, f16.view(), int_view(ok)); }, ErrorKind::kType,
       {"'cache'", "bfloat16 or float8_e4m3fn", "got float16"});
  fail([&] { msa::write_cache(sv, f8.view(), int_view(ok), 0.f); }, ErrorKind::kValue, {"'scale'", "> 0", "got 0"});
  fail([&] { msa::write_cache(sv, f8.view(), int_view(ok), std::nanf("")); }, ErrorKind::kValue, {"'scale'"});
  fail([&] { msa::write_cache(sv, f8.view(), int_view(ok), -2.f); }, ErrorKind::kValue, {"'scale'", "got -2"});
  fail([&] { msa::write_cache(sv, bf.view(), int_view(ok), 2.f); }, ErrorKind::kValue,
       {"'scale'", "only used with a float8_e4m3fn cache"});
  fail([&] { msa::write_cache(sv, bf.view(), int_view(ok), 1.f, ss.view()); }, ErrorKind::kValue,
       {"'slot_scale'", "only used with a float8_e4m3fn cache"});
  fail([&] { msa::write_cache(sv, f8.view(), int_view(ok), 2.f, ss.view()); }, ErrorKind::kValue,
       {"'scale' and 'slot_scale'"});
  fail([&] { msa::write_cache(sv, f8.view(), int_view(ok), 1.f, ss_small.view()); }, ErrorKind::kValue,
       {"'slot_scale'", "page_size", "got 3"});
  fail([&] { msa::write_cache(sv, bf.view(), int_view(three)); }, ErrorKind::kValue,
       {"'slot_ids'", "num_tokens", "got 3"});
  fail([&] { msa::write_cache(src.view({2, 1, 32}), bf.view(), int_view(ok)); }, ErrorKind::kValue,
       {"'cache'", "num_heads", "= 1, got 2"});
  fail([&] { msa::write_cache(src.view({2, 2, 8}, {32, 16, 2}), bf.view(), int_view(ok)); }, ErrorKind::kValue,
       {"'src'", "innermost"});
  std::vector<float> fsrc(64);
  fail([&] { msa::write_cache(TensorView(fsrc.data(), DType::kF32, {2, 2, 16}), bf.view(), int_view(ok)); },
       ErrorKind::kType, {"'cache'", "float32 or float8_e4m3fn"});
  std::vector<uint8_t> u8(2);
  fail([&] { msa::write_cache(sv, bf.view(), TensorView(u8.data(), DType::kU8, {2})); }, ErrorKind::kType,
       {"'slot_ids'", "int32 or int64"});
  fail([&] { msa::write_cache(sv, f8.view(), int_view(ok), 1.f, TensorView(ss.mem.data(), DType::kF32, {2, 2})); },
       ErrorKind::kValue, {"'slot_scale'", "3 dimensions"});
}

TEST(WriteCache, CudaTensorsInACpuBuildAreNotImplemented) {
#ifdef MSA_WITH_CUDA
  GTEST_SKIP() << "this build has the CUDA backend";
#endif
  Buffer src(DType::kBF16, 16);
  const int64_t shape[] = {1, 1, 16};
  std::vector<int32_t> slots = {0};
  Cache bf(DType::kBF16, Pool::kSeparate, 1, 1, 4, 16);
  const TensorView cuda_src(src.data(), DType::kBF16, 3, shape, nullptr, msa::Device{msa::DeviceType::kCUDA, 0});
  expect_msa_error([&] { msa::write_cache(cuda_src, bf.view(), int_view(slots)); }, ErrorKind::kNotImplemented,
                   {"msa.write_cache", "no CUDA backend"});
}

}  // namespace
}  // namespace msa_test
