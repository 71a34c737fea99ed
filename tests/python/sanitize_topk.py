"""select_topk's kernels once each, sized for compute-sanitizer: a warp per row (decode rows of 512 blocks, HKT and
THK) and a CTA per row (2049 to 20000 blocks: the exchanges between its warps), with ties at the threshold, forced
blocks and the options (finite_only, block_map), plus a prefill-shaped call. Each result is compared with the CPU
backend's; exits non-zero on a difference.

    PYTHONPATH=build/python compute-sanitizer --tool memcheck  python3 tests/python/sanitize_topk.py
    PYTHONPATH=build/python compute-sanitizer --tool racecheck python3 tests/python/sanitize_topk.py
    PYTHONPATH=build/python compute-sanitizer --tool synccheck python3 tests/python/sanitize_topk.py
"""
import numpy as np
import torch

import msa


def check(s_thk, qo, kv, topk, force, layout, **opts):
    """The CUDA call on s_thk (laid out as `layout`) against the CPU backend on the same rows."""
    s = s_thk if layout == "THK" else np.ascontiguousarray(s_thk.transpose(1, 2, 0))
    cuda_opts = {k: torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v for k, v in opts.items()}
    got = msa.select_topk(torch.from_numpy(s).cuda(), torch.from_numpy(qo).cuda(), torch.from_numpy(kv).cuda(), topk,
                          layout=layout, force_begin=force[0], force_end=force[1], **cuda_opts)
    want = msa.select_topk(s_thk, qo, kv, topk, layout="THK", force_begin=force[0], force_end=force[1], **opts)
    torch.cuda.synchronize()
    if not np.array_equal(got.cpu().numpy(), np.asarray(want)):
        raise SystemExit(f"select_topk differs from the CPU backend: {s_thk.shape} {layout} top-{topk} {opts}")


def main():
    rng = np.random.default_rng(3)
    for B, nb, layout in ((64, 512, "HKT"), (64, 512, "THK"), (3, 2049, "THK"), (5, 9000, "THK"), (3, 20000, "HKT")):
        qo = np.arange(B + 1, dtype=np.int32)
        kv = rng.integers(1, nb * 128 + 1, B).astype(np.int32)
        kv[0] = nb * 128
        ties = rng.integers(0, 6, (B, 4, nb)).astype(np.float32)  # many keys equal to the threshold
        check(ties, qo, kv, 64, (2, 3), layout)
        spiky = rng.standard_normal((B, 4, nb)).astype(np.float32)
        spiky[rng.random(spiky.shape) < 0.3] = np.nan
        block_map = np.ascontiguousarray(rng.permutation(4 * nb)[:nb].astype(np.int32)[None].repeat(B, 0))
        check(spiky, qo, kv, 16, (0, 1), layout, finite_only=True, block_map=block_map)
    T = 4096  # prefill: one request, causal rows of 1..32 blocks
    check(rng.standard_normal((T, 4, T // 128)).astype(np.float32), np.array([0, T], np.int32),
          np.array([T], np.int32), 16, (0, 1), "HKT")
    print("ok")


if __name__ == "__main__":
    main()
