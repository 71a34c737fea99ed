"""msa.distributed on CUDA with N emulated ranks on one device: the sharded selection equals the single-device
one bitwise and the merged output is within bf16 tolerance, as on the CPU (tests/python/cpu/
test_distributed_emulated.py), at M3's index width (head_dim 128); and the decode step under CUDA-graph capture."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import msa_testing as mt  # noqa: E402
from distributed_testing import check, make_batch, run_emulated, reference, shards  # noqa: E402

pytestmark = pytest.mark.gpu

WORLDS = [1, 2, 4, 8]
LAYOUTS = ["round_robin", "contiguous", "owner"]


def batch_for(rng, qo_lens, kv_lens, **kw):
    kw.setdefault("head_dim", 128)
    kw.setdefault("page_size", 64)
    return make_batch(torch, rng, qo_lens, kv_lens, device="cuda", **kw)


@pytest.mark.parametrize("index_fp8", [False, True])
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode(rng, world, layout, index_fp8):
    batch = batch_for(rng, [1, 1, 3, 1, 2, 16], [700, 1500, 129, 2000, 64, 1800], index_fp8=index_fp8)
    check(torch, batch, "decode", layout, world, 16, rng, max_kv=2048)


@pytest.mark.parametrize("index_fp8", [False, True])
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefill(rng, world, layout, index_fp8):
    batch = batch_for(rng, [600, 37, 1000, 1], [3000, 37, 2400, 513], page_size=128, index_fp8=index_fp8)
    check(torch, batch, "prefill", layout, world, 16, rng, max_kv=3072)


def test_decode_step_in_cuda_graph(rng):
    """DecodeSteps and the emulated layer captured once (plans built before), replayed after the lengths
    change in place: no host read in the step."""
    import msa.distributed as dist
    world, topk, max_kv = 4, 8, 4096
    batch = batch_for(rng, [1] * 8, [4000, 300, 129, 2500, 1, 3000, 1024, 2049])
    sh = shards(torch, "round_robin", world, batch, max_kv // 128, rng, "cuda")
    tables = [dist.shard_page_table(batch["page_table"], s, 64) for s in sh]
    T = batch["q"].shape[0]

    def steps():
        return [dist.DecodeStep(s, t, batch["qo_indptr"], batch["kv_lens"], T) for s, t in zip(sh, tables)]

    plans = [st.plan(num_qo_heads=batch["hq"], num_kv_heads=batch["hkv"], page_size=64, topk=topk)
             for st in steps()]

    def run():
        n = len(sh)
        return dist.emulate_layer(steps(), plans, batch["q"], [batch["k_cache"]] * n, [batch["v_cache"]] * n,
                                  batch["q_index"], [batch["k_index"]] * n, topk)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, bi = run()
    batch["kv_lens"].copy_(torch.tensor([3000, 250, 129, 2400, 1, 2900, 1000, 2049], dtype=torch.int32))
    batch["kv_lens_host"] = batch["kv_lens"].tolist()
    g.replay()
    torch.cuda.synchronize()
    o_ref, bi_ref = reference(batch, "decode", topk, max_kv)
    np.testing.assert_array_equal(bi.cpu().numpy(), bi_ref.cpu().numpy())
    mt.assert_close(o.float().cpu().numpy(), o_ref.float().cpu().numpy())
