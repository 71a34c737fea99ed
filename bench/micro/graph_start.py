"""How long a CUDA graph's replay takes to start behind the L2 flush, by graph shape (docs/prefill.md,
"`shared` and dense: the query-major kernel"). time_flushed (the prefill rows' timing) records its start
event after the 256 MiB memset and replays the graph behind it; the prefill timelines put the graph's
first kernel ~4 us after the memset's end. This times graphs of tiny kernels the same way: one kernel, a
chain of N, and a chain that forks onto a second stream and joins back (the shape of a sparse prefill plan
with its KV-major side stream), so that the start cost of a graph can be told from that of msa's kernels.

    python3 bench/micro/graph_start.py [--iters 50]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import time_flushed  # noqa: E402


def chain(x, n):
    for _ in range(n):
        x.add_(1)


def forked(x, y, n, side):
    x.add_(1)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(y, n)
    chain(x, n)
    torch.cuda.current_stream().wait_stream(side)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    x = torch.zeros(1024, device="cuda")
    y = torch.zeros(1024, device="cuda")
    side = torch.cuda.Stream()
    cases = [("1 kernel", lambda: chain(x, 1)), ("chain of 3", lambda: chain(x, 3)),
             ("chain of 9", lambda: chain(x, 9)), ("fork: 1, then 3 beside 3", lambda: forked(x, y, 3, side))]
    print("| graph | us (flushed, back to back) | eager us (flushed) |")
    print("|---|---|---|")
    for name, fn in cases:
        g = time_flushed(fn, iters=args.iters, warmup=3)
        e = time_flushed(fn, iters=args.iters, warmup=3, graph=False)
        print(f"| {name} | {g:.2f} | {e:.2f} |", flush=True)


if __name__ == "__main__":
    main()
