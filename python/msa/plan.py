"""Plans: the host-side half of the plan/run split (msa.plan_prefill, msa.plan_decode)."""
from __future__ import annotations

import sys

from . import _C
from ._args import host_lengths, integer

Plan = _C.Plan


def _current_cuda_device() -> int:
    """torch's current CUDA device when torch is loaded with CUDA, else 0 (torch is not imported here)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def parse_device(fn: str, device) -> tuple[str, int]:
    """("cpu", 0) or ("cuda", ordinal) from "cpu", "cuda", "cuda:N", a torch.device or an int ordinal.
    A CUDA device without an index is torch's current device when torch is loaded, else 0."""
    if isinstance(device, bool):
        raise TypeError(f"{fn}: argument 'device': expected 'cpu', 'cuda', 'cuda:N', a torch.device or an int, "
                        f"got bool")
    if isinstance(device, int):
        return "cuda", integer(fn, "device", device)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(device, torch.device):
        kind, index = device.type, device.index
    elif isinstance(device, str):
        kind, sep, idx = device.strip().partition(":")
        index = None
        if sep:
            try:
                index = int(idx)
            except ValueError:
                raise ValueError(f"{fn}: argument 'device': expected 'cpu', 'cuda' or 'cuda:N', got {device!r}") \
                    from None
    else:
        raise TypeError(f"{fn}: argument 'device': expected 'cpu', 'cuda', 'cuda:N', a torch.device or an int, "
                        f"got {type(device).__name__}")
    if kind == "cpu" and index in (None, 0):
        return "cpu", 0
    if kind == "cuda":
        return "cuda", _current_cuda_device() if index is None else integer(fn, "device", index)
    raise ValueError(f"{fn}: argument 'device': expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def _config(fn, num_qo_heads, num_kv_heads, head_dim, head_dim_v, page_size, topk, causal, max_splits,
            fixed_split_blocks) -> dict:
    ints = dict(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_v=head_dim_v,
                page_size=page_size, topk=topk, max_splits=max_splits, fixed_split_blocks=fixed_split_blocks)
    cfg = {k: integer(fn, k, v) for k, v in ints.items()}
    cfg["causal"] = bool(causal)
    return cfg


def plan_prefill(qo_lens, kv_lens, *, num_qo_heads, num_kv_heads, head_dim=128, head_dim_v=0, page_size=128,
                 topk=0, causal=True, qo_offset=None, device="cpu", max_splits=0, fixed_split_blocks=0) -> Plan:
    """Plans attention over a ragged batch whose lengths are known on the host.

    Args:
        qo_lens: query tokens per request (list, numpy array or CPU tensor of ints), [B].
        kv_lens: keys per request, cached prefix plus the new chunk, [B].
        num_qo_heads, num_kv_heads: Hq and Hkv; Hq must be a multiple of Hkv (GQA).
        head_dim: D of q and k. head_dim_v: D of v and o (0: head_dim).
        page_size: tokens per physical KV page.
        topk: slots per block_idx row (sparse attention); 0 plans dense attention.
        causal: query i of request b sees keys j <= qo_offset[b] + i.
        qo_offset: absolute position of each request's first query, [B]; default kv_len - qo_len.
        device: "cpu", "cuda", "cuda:N", a torch.device or an int CUDA ordinal.
        max_splits: upper bound on KV splits per (request, KV head); 0 picks from the device, 1 never splits.
        fixed_split_blocks: > 0 makes every split cover this many blocks (batch-invariant results).

    Returns:
        msa.Plan. The tensors later passed to msa.attention must describe the same lengths.
        Planning never waits on the device.

    One run of a plan at a time: its workspaces are written by every run, so two runs of one plan in flight
    at once (on two streams, or from two threads) give wrong results. Give each concurrent caller a plan of
    its own; plan.clone() makes one with the same configuration and lengths.
    """
    fn = "msa.plan_prefill"
    cfg = _config(fn, num_qo_heads, num_kv_heads, head_dim, head_dim_v, page_size, topk, causal, max_splits,
                  fixed_split_blocks)
    dev_type, dev_id = parse_device(fn, device)
    qo = host_lengths(fn, "qo_lens", qo_lens)
    offsets = None if qo_offset is None else host_lengths(fn, "qo_offset", qo_offset)
    if offsets is not None and offsets.size != qo.size:  # the C++ entry point reads no entries as none given
        raise ValueError(f"{fn}: argument 'qo_offset': expected {qo.size} entries (one per request) or none, "
                         f"got {offsets.size}")
    return _C.plan_prefill(qo, host_lengths(fn, "kv_lens", kv_lens), offsets, device_type=dev_type, device_id=dev_id,
                           **cfg)


def plan_decode(batch_size, max_qo_len, max_kv_len, *, num_qo_heads, num_kv_heads, head_dim=128, head_dim_v=0,
                page_size=128, topk=0, causal=True, device="cpu", max_splits=0, fixed_split_blocks=0) -> Plan:
    """Plans decode attention from limits only, so one plan serves every step (and CUDA graph replays):
    the lengths, page table and block indexes are read on the device when msa.attention runs.

    Args:
        batch_size: requests per call.
        max_qo_len: bound on query tokens per request (1..16; > 1 for speculative decoding / MTP).
        max_kv_len: bound on keys per request.
        num_qo_heads, num_kv_heads, head_dim, head_dim_v, page_size, topk, causal, device, max_splits,
        fixed_split_blocks: as for msa.plan_prefill.

    Returns:
        msa.Plan; q passed to msa.attention may hold up to batch_size * max_qo_len tokens. kv_lens above
        max_kv_len are refused where they are host-readable (CPU tensors; CUDA tensors with validate=True).

    One run of a plan at a time, as for msa.plan_prefill: each concurrent caller (stream, thread) needs a
    plan of its own, e.g. plan.clone().
    """
    fn = "msa.plan_decode"
    cfg = _config(fn, num_qo_heads, num_kv_heads, head_dim, head_dim_v, page_size, topk, causal, max_splits,
                  fixed_split_blocks)
    dev_type, dev_id = parse_device(fn, device)
    return _C.plan_decode(integer(fn, "batch_size", batch_size), integer(fn, "max_qo_len", max_qo_len),
                          integer(fn, "max_kv_len", max_kv_len, bits=64), device_type=dev_type, device_id=dev_id, **cfg)
