// The reference backend's parallel loop: every index once, worker ids in range, errors rethrown.
#include <atomic>
#include <stdexcept>

#include "reference/parallel.h"
#include "test_util.h"

namespace msa_test {
namespace {

namespace ref = msa::detail::reference;

TEST(ParallelFor, VisitsEveryIndexOnce) {
  for (int64_t n : {0, 1, 7, 10000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<bool> bad_worker{false};
    const int workers = ref::worker_count(n);
    ref::parallel_for(n, [&](int64_t i, int w) {
      hits[i].fetch_add(1);
      if (w < 0 || w >= workers) bad_worker = true;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " index " << i;
    EXPECT_FALSE(bad_worker);
  }
}

TEST(ParallelFor, RethrowsTheBodysException) {
  EXPECT_THROW(ref::parallel_for(1000, [](int64_t i, int) {
                 if (i == 500) throw std::runtime_error("boom");
               }),
               std::runtime_error);
}

}  // namespace
}  // namespace msa_test
