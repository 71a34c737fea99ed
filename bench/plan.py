"""Host cost of building plans (benchmarks.md: plan() for decode B=128 <= 20 us of host time, no device sync).

Each plan is built while the GPU is busy with a sleep kernel of ~50 ms (common.host_us): a plan that
synchronized would wait for it, so "no sync" shows as a host time far below the sleep. Times are medians over repeated builds after a
warm-up (the first build of a shape allocates; later ones reuse msa's workspace cache), measured through the
Python binding, so they include ~1-2 us of nanobind call overhead.
"""
from __future__ import annotations

import argparse

import common
import msa


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=50)
    common.add_output_options(ap)
    args = ap.parse_args()
    common.check_record(ap, args)
    common.main_guard()
    ceil = common.ceilings()
    rows = []
    m3 = dict(num_qo_heads=64, num_kv_heads=4, head_dim=128, page_size=128, topk=16, device="cuda")
    for B in (1, 32, 128):
        med, worst = common.host_us(lambda: msa.plan_decode(B, 1, 131072, **m3), args.reps)
        rows.append(common.row(f"plan-decode-B{B}", "M3-TP1", "sparse", "msa", med, worst_us=round(worst, 2),
                               bar="us<=20" if B == 128 else None))
        print(f"plan_decode B={B:<4} median {med:8.2f} us  max {worst:8.2f} us", flush=True)
    for name, (qo, kv) in {"P-32K": ([32768], [32768]), "P-chunk": ([4096], [32768])}.items():
        med, worst = common.host_us(lambda: msa.plan_prefill(qo, kv, **m3), max(args.reps // 5, 5))
        rows.append(common.row(f"plan-prefill-{name}", "M3-TP1", "sparse", "msa", med, worst_us=round(worst, 2)))
        print(f"plan_prefill {name:<8} median {med:8.2f} us  max {worst:8.2f} us", flush=True)
    common.write_results("plan", ceil, rows, args.out_dir, record=args.record)


if __name__ == "__main__":
    main()
