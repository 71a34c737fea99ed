"""Pieces shared by the seeded random-configuration sweeps (test_gpu_fuzz.py: msa.attention;
test_gpu_fuzz_ops.py: block_scores, select_topk, merge_states, build_page_table): the seed range of a GPU
sweep, a weighted pick from a draw's generator, and the retries that shrink a draw to its cost budget."""
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
