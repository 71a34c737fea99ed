"""Pieces shared by the seeded random-configuration sweeps (test_gpu_fuzz.py: msa.attention;
test_gpu_fuzz_ops.py: block_scores, select_topk, merge_states, build_page_table): the seed range of a GPU
sweep, a weighted pick from a draw's generator, the retries that shrink a draw to its cost budget, and the
request lengths of a decode or prefill batch."""
import os
import pprint

import numpy as np


def gpu_seeds(default: int) -> range:
    """The GPU sweep's seeds: range(default), or MSA_FUZZ_SEEDS seeds from MSA_FUZZ_FIRST_SEED (a longer soak
    over other seeds)."""
    first = int(os.environ.get("MSA_FUZZ_FIRST_SEED", "0"))
    return range(first, first + int(os.environ.get("MSA_FUZZ_SEEDS", str(default))))


def pick(r: np.random.Generator, values, p=None):
    """One of values (a python value), optionally weighted."""
    i = int(r.choice(len(values), p=None if p is None else np.asarray(p, float) / np.sum(p)))
    return values[i]


def describe(case: dict, rebuild: str) -> str:
    """The drawn case for a failure message, with the call that rebuilds it."""
    return f"fuzz case (rebuild with {rebuild}):\n" + pprint.pformat(case, width=110, sort_dicts=False)


def shrinking(what: str, batch: int, attempts: int = 200):
    """(attempt, scale, batch) for the retries of a draw that must fit a cost budget: each retry scales the
    lengths by 0.8 more and every second one drops a request (batch >= 1). The caller breaks out once the draw
    fits; past the last attempt this raises, naming `what`."""
    scale = 1.0
    for attempt in range(attempts):
        yield attempt, scale, batch
        scale *= 0.8
        if attempt % 2:
            batch = max(1, batch - 1)
    raise AssertionError(f"{what}: no configuration within the budget")


def offset_of(r: np.random.Generator, ql: int, kl: int, causal: bool, explicit_offset: bool) -> tuple:
    """(qo_offset, kv_len) of a request of ql queries and kl keys: kl - ql, or an explicit offset (causal: keys
    after the chunk when below kl - ql; non-causal: anywhere, and sometimes fewer keys than queries, maybe none)."""
    o = kl - ql
    if explicit_offset:
        if causal:
            o = int(r.integers(0, kl - ql + 1))
        else:
            o = int(r.integers(0, kl + 1))
            if r.random() < 0.15:
                kl = int(r.integers(0, ql + 1))
    return o, kl


def decode_lengths(r, B, qmax, ragged, zero_q, causal, explicit_offset, scale, *, long_max, edge_blocks):
    """(qo_lens, kv_lens, qo_offsets) of B decode requests: 1..qmax queries (qmax unless ragged; some 0 with
    zero_q, some of those with no keys either), short / mid / long (< long_max) key runs or one within a key of a
    multiple of 128 (< edge_blocks blocks), scaled by `scale`."""
    qo, kv, off = [], [], []
    for _ in range(B):
        ql = int(r.integers(1, qmax + 1)) if ragged else qmax
        if zero_q and r.random() < 0.25:
            ql = 0
        kind = pick(r, ["short", "mid", "long", "edge"], [0.3, 0.35, 0.2, 0.15])
        if kind == "short":
            kl = int(r.integers(1, 300))
        elif kind == "mid":
            kl = int(r.integers(300, 2000))
        elif kind == "long":
            kl = int(r.integers(2000, long_max))
        else:  # around a multiple of 128: the last block full, one key past it, one short of it
            kl = 128 * int(r.integers(1, edge_blocks)) + int(r.integers(-1, 2))
        kl = max(int(kl * scale), ql, 1)
        if ql == 0 and r.random() < 0.4:
            kl = 0  # an empty request
        o, kl = offset_of(r, ql, kl, causal, explicit_offset)
        qo.append(ql)
        kv.append(kl)
        off.append(o)
    return qo, kv, off


def prefill_lengths(r, B, zero_q, causal, explicit_offset, scale, *, prefix_max, edge_blocks):
    """(qo_lens, kv_lens, qo_offsets) of B prefill chunks: 1, 2..40 or 41..300 queries (some 0 with zero_q) after
    no prefix, any (< prefix_max) or one within a key of a multiple of 128 (< edge_blocks blocks), with keys after
    the chunk for some explicit offsets; non-causal explicit offsets sometimes give fewer keys than queries."""
    qo, kv, off = [], [], []
    for _ in range(B):
        kind = pick(r, ["one", "small", "mid", "zero"], [0.1, 0.3, 0.5, 0.1 if zero_q else 0.0])
        if kind in ("one", "zero"):
            ql = 1 if kind == "one" else 0
        else:
            ql = max(int((int(r.integers(2, 41)) if kind == "small" else int(r.integers(41, 301))) * scale), 1)
        pkind = pick(r, ["none", "any", "edge"], [0.35, 0.5, 0.15])
        prefix = 0 if pkind == "none" else (int(r.integers(1, prefix_max)) if pkind == "any"
                                            else 128 * int(r.integers(1, edge_blocks)) + int(r.integers(-1, 2)))
        prefix = int(prefix * scale)
        tail = int(r.integers(1, 400) * scale) if explicit_offset and r.random() < 0.6 else 0
        kl, o = prefix + ql + tail, prefix  # tail: keys after the chunk (explicit offsets only)
        if explicit_offset and not causal and r.random() < 0.15:
            o, kl = int(r.integers(0, 200)), int(r.integers(0, ql + 1))  # fewer keys than queries, maybe none
        qo.append(ql)
        kv.append(kl)
        off.append(o)
    return qo, kv, off
