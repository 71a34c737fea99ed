#include "core/value_checks.h"

#include <algorithm>
#include <vector>

#include "msa/error.h"

namespace msa::detail {

namespace {
constexpr int kBlock = 128;
}  // namespace

HostSeqs host_seqs(const Sequences& s, void* stream) {
  return HostSeqs{HostInts(s.qo_indptr, stream), HostInts(s.kv_lens, stream),
                  s.qo_offset.defined() ? HostInts(s.qo_offset, stream) : HostInts()};
}

void check_seq_values(const char* fn, const HostSeqs& h, int64_t B, int64_t total_q, bool causal, const Plan* plan,
                      const char* tokens_arg) {
  MSA_CHECK(h.qo_indptr.at(0) == 0, kValue, fn, ": argument 'qo_indptr': expected qo_indptr[0] = 0, got ",
            h.qo_indptr.at(0));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = h.qo_len(b), kl = h.kv_len(b);
    MSA_CHECK(ql >= 0, kValue, fn, ": argument 'qo_indptr': expected non-decreasing, got qo_indptr[", b, "] = ",
              h.qo_indptr.at(b), " > qo_indptr[", b + 1, "] = ", h.qo_indptr.at(b + 1));
    MSA_CHECK(kl >= 0, kValue, fn, ": argument 'kv_lens': expected >= 0, got ", kl, " at request ", b);
    const int64_t off = h.offset(b);
    if (causal)
      MSA_CHECK(off >= 0 && off + ql <= kl, kValue, fn, ": argument '",
                h.qo_offset.empty() ? "kv_lens" : "qo_offset",
                "': expected qo_offset + qo_len <= kv_len and qo_offset >= 0 for causal attention, got qo_offset = ",
                off, ", qo_len = ", ql, ", kv_len = ", kl, " at request ", b);
    else
      MSA_CHECK(off >= 0, kValue, fn, ": argument 'qo_offset': expected >= 0, got ", off, " at request ", b);
    if (plan && plan->phase() == Phase::kDecode) {
      MSA_CHECK(ql <= plan->max_qo_len(), kValue, fn, ": argument 'qo_indptr': request ", b, " has ", ql,
                " query tokens, more than the plan's max_qo_len = ", plan->max_qo_len());
      MSA_CHECK(kl <= plan->max_kv_len(), kValue, fn, ": argument 'kv_lens': request ", b, " has kv_len = ", kl,
                ", more than the plan's max_kv_len = ", plan->max_kv_len(), " (the bound given to plan_decode)");
    }
    if (plan && plan->phase() == Phase::kPrefill) {
      MSA_CHECK(ql == plan->qo_lens()[b] && kl == plan->kv_lens()[b], kValue, fn,
                ": arguments 'qo_indptr'/'kv_lens': request ", b, " has qo_len = ", ql, ", kv_len = ", kl,
                " but the prefill plan was built for qo_len = ", plan->qo_lens()[b], ", kv_len = ",
                plan->kv_lens()[b]);
    }
  }
  MSA_CHECK(h.qo_indptr.at(B) <= total_q, kValue, fn, ": argument 'qo_indptr': expected qo_indptr[batch_size] <= ",
            total_q, " (tokens in ", tokens_arg, "), got ", h.qo_indptr.at(B));
}

void check_page_values(const char* fn, const PageTable& pt, const PageTableParams& p, const HostSeqs& h, int64_t B,
                       int64_t page_size, bool entries, void* stream) {
  HostInts table(pt.table, stream);
  HostInts indptr = pt.indptr.defined() ? HostInts(pt.indptr, stream) : HostInts();
  if (!indptr.empty()) {
    MSA_CHECK(indptr.at(0) >= 0, kValue, fn, ": argument 'page_indptr': expected page_indptr[0] >= 0, got ",
              indptr.at(0));
    for (int64_t b = 0; b < B; ++b)
      MSA_CHECK(indptr.at(b + 1) >= indptr.at(b), kValue, fn, ": argument 'page_indptr': expected non-decreasing, ",
                "got page_indptr[", b, "] = ", indptr.at(b), " > page_indptr[", b + 1, "] = ", indptr.at(b + 1));
    MSA_CHECK(indptr.at(B) <= p.row_capacity, kValue, fn, ": argument 'page_indptr': expected page_indptr[",
              B, "] <= ", p.row_capacity, " (entries in page_table), got ", indptr.at(B));
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t need = ceil_div(h.kv_len(b), page_size);
    const int64_t have = indptr.empty() ? p.row_capacity : indptr.at(b + 1) - indptr.at(b);
    MSA_CHECK(need <= have, kValue, fn, ": argument 'page_table': request ", b, " has kv_len = ", h.kv_len(b),
              " (", need, " pages of ", page_size, " tokens) but its page-table row holds ", have, " entries");
    if (!entries) continue;
    const int64_t base = indptr.empty() ? 0 : indptr.at(b);
    for (int64_t i = 0; i < need; ++i) {
      const int64_t e = indptr.empty() ? table.at(b, i) : table.at(base + i);
      MSA_CHECK(e >= 0 && e < p.num_pages, kValue, fn, ": argument 'page_table': request ", b, ", logical page ",
                i, ": expected a page id in [0, ", p.num_pages, ") (pages in the cache), got ", e);
    }
  }
}

void check_block_idx_values(const char* fn, const TensorView& bi, const HostSeqs& h, int64_t B, void* stream) {
  HostInts v(bi, stream);
  const int64_t heads = bi.size(1), topk = bi.size(2);
  std::vector<int64_t> row(static_cast<size_t>(topk));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nblk = ceil_div(h.kv_len(b), kBlock);
    for (int64_t t = h.qo_start(b); t < h.qo_start(b) + h.qo_len(b); ++t)
      for (int64_t g = 0; g < heads; ++g) {
        int64_t n = 0;
        for (int64_t i = 0; i < topk; ++i) {
          const int64_t e = v.at(t, g, i);
          if (e < 0) continue;
          MSA_CHECK(e < nblk, kValue, fn, ": argument 'block_idx': token ", t, ", head ", g, ", slot ", i,
                    ": block ", e, " is out of range: expected a block in [0, ", nblk, ") for kv_len = ",
                    h.kv_len(b), " (request ", b, "), or < 0 for an empty slot");
          row[n++] = e;
        }
        std::sort(row.begin(), row.begin() + n);
        for (int64_t i = 1; i < n; ++i)
          MSA_CHECK(row[i] != row[i - 1], kValue, fn, ": argument 'block_idx': token ", t, ", head ", g,
                    ": block ", row[i], " is selected twice");
      }
  }
}

}  // namespace msa::detail
