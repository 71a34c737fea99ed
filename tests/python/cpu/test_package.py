"""The package itself: importing without torch, the public names and their docstrings, plan properties,
host length and device arguments."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import msa

PUBLIC = ["Plan", "attention", "block_scores", "build_page_table", "cuda_available", "cuda_compute_capability",
          "merge_candidates", "merge_states", "plan_decode", "plan_prefill", "select_topk", "sparse_attention_layer",
          "write_cache"]


def test_import_and_run_without_torch():
    """`import msa` must never import torch: run a small attention with torch made unimportable."""
    code = textwrap.dedent("""
        import sys

        class BlockTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")

        sys.meta_path.insert(0, BlockTorch())
        import numpy as np
        import msa

        plan = msa.plan_prefill([3], [200], num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=64)
        q = np.ones((3, 2, 64), np.float32)
        k = np.ones((4, 1, 64, 64), np.float32)
        o = msa.attention(plan, q, k, k, np.arange(4, dtype=np.int32)[None], np.array([0, 3], np.int32),
                          np.array([200], np.int32))
        assert np.allclose(o, 1.0), o
        assert "torch" not in sys.modules
        print("ok")
    """)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(msa.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pkg_root, os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def _run_python(code: str) -> subprocess.CompletedProcess:
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(msa.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pkg_root, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("module", ["msa.sglang", "msa.fmha_sm100", "msa.engines.sglang", "msa.torch_ops"])
def test_torch_modules_without_torch_say_what_they_need(module):
    """Where torch is not installed, the torch-only modules raise an ImportError that says they need torch and
    what works without it; msa itself still imports."""
    res = _run_python(f"""
        import sys

        class NoTorch:  # as if torch were not installed
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        sys.meta_path.insert(0, NoTorch())
        import msa
        try:
            import {module}
        except ImportError as e:
            assert isinstance(e, ModuleNotFoundError) and e.name == "torch", repr(e)
            print(e)
        else:
            raise AssertionError("imported without torch")
    """)
    assert res.returncode == 0, res.stderr
    msg = res.stdout
    assert "needs torch: pip install torch" in msg and "numpy" in msg and "msa.attention" in msg, msg
    assert msg.startswith(module.replace("engines.", "")), msg


def test_engine_drop_ins_are_importable_under_their_public_names():
    """msa.sglang and msa.fmha_sm100 are the modules of msa.engines (aliases, not copies), private names
    included. A stand-in torch lets the modules import where torch is not installed."""
    res = _run_python("""
        import sys
        from unittest import mock

        if "torch" not in sys.modules:
            try:
                import torch
            except ImportError:
                sys.modules["torch"] = mock.MagicMock(name="torch")
        import msa.engines.fmha_sm100
        import msa.engines.sglang
        import msa.sglang
        from msa.fmha_sm100 import DECODE_MAX_KV_LEN, _plan_dict, fmha_sm100
        from msa.sglang import msa_sparse_decode_main

        assert msa.sglang is msa.engines.sglang and msa.fmha_sm100 is msa.engines.fmha_sm100
        assert sys.modules["msa.sglang"] is msa.engines.sglang
        assert fmha_sm100 is msa.engines.fmha_sm100.fmha_sm100 and DECODE_MAX_KV_LEN == 1 << 20
        assert msa_sparse_decode_main.__module__ == "msa.engines.sglang"
        print("ok")
    """)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_cuda_compute_capability_without_a_gpu():
    """0 where cuda_available() is False (no CUDA backend, or no usable GPU); a capability >= 80 otherwise."""
    cc = msa.cuda_compute_capability()
    assert (cc == 0) if not msa.cuda_available() else cc >= 80


def test_public_names_have_docstrings():
    assert sorted(msa.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        doc = getattr(msa, name).__doc__
        assert doc and len(doc.strip()) > 20, name
    assert msa.__version__ == "0.1.0"
    assert isinstance(msa.cuda_available(), bool)


def test_prefill_plan_properties():
    plan = msa.plan_prefill((3, 0, 7), np.array([300, 10, 7], np.uint16), num_qo_heads=8, num_kv_heads=2,
                            head_dim=128, head_dim_v=64, page_size=32, topk=5, causal=False,
                            qo_offset=[1, 2, 0], device="cpu:0")
    assert isinstance(plan, msa.Plan)
    assert (plan.phase, plan.device, plan.batch_size, plan.max_qo_len, plan.max_kv_len, plan.total_q) == \
        ("prefill", "cpu", 3, 7, 300, 10)
    assert (plan.num_qo_heads, plan.num_kv_heads, plan.head_dim, plan.head_dim_v, plan.page_size, plan.topk,
            plan.causal) == (8, 2, 128, 64, 32, 5, False)
    assert repr(plan) == ("msa.Plan(phase='prefill', device='cpu', batch_size=3, max_qo_len=7, max_kv_len=300, "
                          "total_q=10, num_qo_heads=8, num_kv_heads=2, head_dim=128, head_dim_v=64, page_size=32, "
                          "topk=5, causal=False)")
    with pytest.raises(AttributeError):
        plan.topk = 3


def test_head_dim_v_defaults_to_head_dim():
    plan = msa.plan_decode(np.int64(2), 1, 100, num_qo_heads=4, num_kv_heads=4, head_dim=256)
    assert plan.head_dim_v == 256 and plan.total_q == 2


def test_empty_batch_is_rejected():
    with pytest.raises(ValueError, match="'qo_lens'"):
        msa.plan_prefill([], [], num_qo_heads=2, num_kv_heads=1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF dynamic symbols")
def test_extension_keeps_its_static_archives_private():
    """The module links libmsa, cudart and, with some toolchains, libstdc++ as static archives; none of their
    symbols may be exported. With the H200 machine's compiler (static libstdc++) the module exported part of
    libstdc++, and a process that had also loaded the system libstdc++ crashed in repr(msa.Plan) and in every
    error message with a number (docs/architecture.md, Toolchains). Without LINKER:--exclude-libs,ALL the
    core library's msa:: symbols show here on any toolchain."""
    import shutil

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not installed")
    out = subprocess.run([nm, "-D", "-C", "--defined-only", msa._C.__file__], capture_output=True, text=True,
                         check=True).stdout
    leaked = [line for line in out.splitlines() if "msa::" in line or "std::locale" in line]
    assert not leaked, leaked[:5]
