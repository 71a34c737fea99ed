"""Host cost of one msa.attention call (run() enqueues its kernels; an engine's eager prefill pays this per layer).

sglang runs prefill (extend) eagerly: every layer's attention call costs host time to convert its tensors, encode
the TMA descriptors and launch the kernels. When that exceeds the call's GPU time the GPU waits for the host. Each
call here is enqueued while the GPU is busy with a sleep kernel, so the time is the host's alone (a call that
synchronized would show as ~the sleep). Rows: the whole msa.attention call with the tensors imported through
torch's DLPack C exchange API (impl msa, the default where torch has one) and through t.__dlpack__()
(msa-dlpack-import), and parts measured apart: the DLPack export of the call's tensors (t.__dlpack__()), the
stream query (torch.cuda.current_stream), an empty launch through torch, and the binding called directly.
"""
from __future__ import annotations

import argparse

import torch

import common
import msa

SHAPES = {"M3-TP1": (64, 4), "M3-TP4": (16, 1)}
D, BLOCK, TOPK = 128, 128, 16


def prefill_case(hq: int, hkv: int, qo: int, kv: int, topk: int):
    """Tensors of one request: qo query tokens at the end of kv keys; selections valid (own block, earlier ones)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    pages = (kv + BLOCK - 1) // BLOCK
    q = torch.randn(qo, hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(pages, hkv, BLOCK, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    page_table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32)[None]
    qo_indptr = torch.tensor([0, qo], device="cuda", dtype=torch.int32)
    kv_lens = torch.tensor([kv], device="cuda", dtype=torch.int32)
    sel = None
    if topk:
        own = (torch.arange(kv - qo, kv, device="cuda") // BLOCK).to(torch.int32)
        sel = (own[:, None, None] - torch.arange(topk, device="cuda", dtype=torch.int32)).clamp(min=-1)
        sel = sel.expand(qo, hkv, topk).contiguous()
    return q, k, v, page_table, qo_indptr, kv_lens, sel


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=200)
    common.add_output_options(ap)
    args = ap.parse_args()
    common.check_record(ap, args)
    common.main_guard()
    ceil = common.ceilings()
    rows = []
    api = [a for a in ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__") if hasattr(torch.Tensor, a)]
    print(f"# torch {torch.__version__}: DLPack C exchange API {api[0] if api else 'absent'}", flush=True)

    def host(call):  # a sleep kernel before every 25th call keeps the GPU busy without a long launch queue
        return common.host_us(call, args.reps, sleep_every=25)

    def emit(name, shape, pattern, med, worst, impl="msa"):
        rows.append(common.row(name, shape, pattern, impl, med, worst_us=round(worst, 2)))
        print(f"{name:28s} {shape:7s} {pattern:8s} {impl:18s} median {med:8.2f} us  max {worst:8.2f} us", flush=True)

    def both_imports(name, shape, pattern, call):
        """The call with tensors imported through torch's DLPack C exchange API (msa's default where torch has
        one) and through t.__dlpack__() (msa._C._set_fast_import(False))."""
        for on, impl in ((True, "msa"), (False, "msa-dlpack-import")):
            was = msa._C._set_fast_import(on)
            try:
                emit(name, shape, pattern, *host(call), impl=impl)
            finally:
                msa._C._set_fast_import(was)

    for shape, (hq, hkv) in SHAPES.items():
        for mode, topk in (("dense", 0), ("qmajor", TOPK), ("auto", TOPK)):
            q, k, v, pt, qi, kl, sel = prefill_case(hq, hkv, 4096, 32768, topk)
            env = {"MSA_SM90_PREFILL": mode} if topk else {}
            with common.environment(env):
                plan = msa.plan_prefill([4096], [32768], num_qo_heads=hq, num_kv_heads=hkv, head_dim=D,
                                        page_size=BLOCK, topk=topk, causal=True, device="cuda")
            out = torch.empty_like(q)

            def call():
                msa.attention(plan, q, k, v, pt, qi, kl, block_idx=sel, out=out)

            both_imports("run-prefill-P-chunk", shape, mode, call)
            if shape == "M3-TP4" and mode == "auto":
                tensors = [q, k, v, pt, qi, kl, sel, out]
                emit("part-dlpack-export-x8", shape, "-", *host(lambda: [t.__dlpack__() for t in tensors]))
                emit("part-current-stream", shape, "-", *host(lambda: torch.cuda.current_stream().cuda_stream))
                emit("part-launch-sleep0", shape, "-", *host(lambda: torch.cuda._sleep(0)))
                stream = torch.cuda.current_stream().cuda_stream
                both_imports("part-binding-direct", shape, mode, lambda: msa._C.attention(
                    plan, q, k, v, pt, None, qi, kl, None, sel, out, None, 0.0, False, stream))
            del plan
    for B in (1, 64):
        hq, hkv = SHAPES["M3-TP1"]
        plan = msa.plan_decode(B, 1, 65536, num_qo_heads=hq, num_kv_heads=hkv, head_dim=D, page_size=BLOCK,
                               topk=TOPK, device="cuda")
        pages = 512 * B
        q = torch.randn(B, hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(pages, hkv, BLOCK, D, device="cuda", dtype=torch.bfloat16)
        pt = torch.arange(pages, device="cuda", dtype=torch.int32).view(B, 512)
        qi = torch.arange(B + 1, device="cuda", dtype=torch.int32)
        kl = torch.full((B,), 65536, device="cuda", dtype=torch.int32)
        sel = torch.arange(TOPK, device="cuda", dtype=torch.int32).expand(B, hkv, TOPK).contiguous()
        out = torch.empty_like(q)
        both_imports(f"run-decode-D-B{B}", "M3-TP1", "sparse",
                     lambda: msa.attention(plan, q, k, k, pt, qi, kl, block_idx=sel, out=out))
    common.write_results("run_host", ceil, rows, args.out_dir, record=args.record)


if __name__ == "__main__":
    main()
