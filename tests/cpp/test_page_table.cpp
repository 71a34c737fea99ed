// build_page_table on the CPU backend: a serving engine's token-to-slot map to a page table.
#include <numeric>

#include "test_util.h"

namespace msa_test {
namespace {

struct SlotMap {
  int64_t pool_rows, max_context, row_pitch;
  std::vector<int32_t> mem;  // [pool_rows, row_pitch], the first max_context columns used
  std::vector<std::vector<int32_t>> page_ids;  // per pool row: the physical page of each logical page
  TensorView view() const {
    return TensorView(const_cast<int32_t*>(mem.data()), DType::kI32, {pool_rows, max_context}, {row_pitch, 1});
  }
};

// Each pool row maps its tokens onto whole pages of a shuffled pool (slot = page * P + offset).
SlotMap make_slots(int64_t pool_rows, int64_t max_context, int page_size, int64_t pitch_pad, Rng& rng) {
  SlotMap m{pool_rows, max_context, max_context + pitch_pad, {}, {}};
  m.mem.assign(static_cast<size_t>(pool_rows * m.row_pitch), -7);
  const int64_t pages_per_row = (max_context + page_size - 1) / page_size;
  std::vector<int32_t> ids(static_cast<size_t>(pool_rows * pages_per_row));
  std::iota(ids.begin(), ids.end(), 0);
  rng.shuffle(ids);
  m.page_ids.resize(pool_rows);
  for (int64_t r = 0; r < pool_rows; ++r)
    for (int64_t p = 0; p < pages_per_row; ++p) {
      const int32_t id = ids[r * pages_per_row + p];
      m.page_ids[r].push_back(id);
      for (int64_t tok = p * page_size; tok < std::min<int64_t>((p + 1) * page_size, max_context); ++tok)
        m.mem[r * m.row_pitch + tok] = static_cast<int32_t>(id * page_size + tok % page_size);
    }
  return m;
}

template <typename Index, typename Len>
void check_build(int page_size, int64_t pitch_pad, uint64_t seed) {
  Rng rng(seed);
  const int64_t max_context = 1000;
  const SlotMap slots = make_slots(5, max_context, page_size, pitch_pad, rng);
  const std::vector<Index> req = {3, 0, 4, 1, 3};
  const std::vector<Len> lens = {0, 17, static_cast<Len>(page_size), 1000, 1};
  const DType idx_t = sizeof(Index) == 8 ? DType::kI64 : DType::kI32;
  const DType len_t = sizeof(Len) == 8 ? DType::kI64 : DType::kI32;
  const int64_t B = static_cast<int64_t>(req.size());
  const int64_t max_pages = (max_context + page_size - 1) / page_size + 2;
  std::vector<int32_t> out(static_cast<size_t>(B * max_pages), 777);
  msa::build_page_table(slots.view(), TensorView(const_cast<Index*>(req.data()), idx_t, {B}),
                        TensorView(const_cast<Len*>(lens.data()), len_t, {B}), page_size,
                        TensorView(out.data(), DType::kI32, {B, max_pages}));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t pages = (int64_t(lens[b]) + page_size - 1) / page_size;
    for (int64_t p = 0; p < max_pages; ++p)
      EXPECT_EQ(out[b * max_pages + p], p < pages ? slots.page_ids[req[b]][p] : -1) << "request " << b << " page " << p;
  }
}

TEST(BuildPageTable, Int32IndexesAndLengths) { check_build<int32_t, int32_t>(16, 0, 1); }
TEST(BuildPageTable, Int64IndexesAndLengths) { check_build<int64_t, int64_t>(64, 0, 2); }
TEST(BuildPageTable, MixedWidthsStridedMap) { check_build<int64_t, int32_t>(128, 24, 3); }
TEST(BuildPageTable, PageSizeOne) { check_build<int32_t, int64_t>(1, 3, 4); }

TEST(BuildPageTable, NegativeSlotGivesNoPage) {
  Rng rng(5);
  SlotMap slots = make_slots(2, 256, 64, 0, rng);
  slots.mem[1 * slots.row_pitch + 64] = -1;  // row 1, page 1: an unmapped token
  const std::vector<int32_t> req = {1}, lens = {200};
  std::vector<int32_t> out(5, 777);
  msa::build_page_table(slots.view(), int_view(req), int_view(lens), 64, TensorView(out.data(), DType::kI32, {1, 5}));
  EXPECT_EQ(out, (std::vector<int32_t>{slots.page_ids[1][0], -1, slots.page_ids[1][2], slots.page_ids[1][3], -1}));
}

}  // namespace
}  // namespace msa_test
