"""scripts/prefill_protocol_model.py: the Hopper prefill kernels' mbarrier protocols (query-major with the
cross-tile step and the scheduler warp, KV-major with its scheduler warp) finish on random work lists
and random interleavings, every buffer holding what its reader expects; and the model catches a
protocol bug (a scheduler that does not wait for its release deadlocks)."""
import importlib.util
import random
from pathlib import Path

import pytest

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
SCRIPT = str(REPO / "scripts" / "prefill_protocol_model.py")


def _load(src=None):
    spec = importlib.util.spec_from_file_location("prefill_protocol_model", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    if src is None:
        spec.loader.exec_module(mod)
    else:
        exec(compile(src, SCRIPT, "exec"), mod.__dict__)
    return mod


def test_protocols_hold():
    _load().main(trials=400)


@pytest.mark.parametrize("kernel", ["qmajor", "kvmajor"])
def test_model_catches_a_missing_wait(kernel):
    src = open(SCRIPT).read()
    at = src.index("def run_kvmajor")
    wait = {"qmajor": "if q_it > 0: yield lambda: go.passed((q_it - 1) & 1)",
            "kvmajor": "if item_it > 0: yield lambda: go.passed((item_it - 1) & 1)"}[kernel]
    head, tail = src[:at], src[at:]
    if kernel == "qmajor":
        assert wait in head
        head = head.replace(wait, "pass", 1)
    else:
        assert wait in tail
        tail = tail.replace(wait, "pass", 1)
    mod = _load(head + tail)
    with pytest.raises((RuntimeError, AssertionError)):
        for trial in range(200):
            rnd = random.Random(trial)
            if kernel == "qmajor":
                mod.run_qmajor([(k, rnd.choice([1, 2, 3, 16])) for k in range(rnd.randint(2, 9))], trial)
            else:
                mod.run_kvmajor([(k, rnd.choice([1, 8, 9, 17])) for k in range(rnd.randint(2, 9))], trial)
