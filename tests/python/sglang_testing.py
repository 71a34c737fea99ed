"""sglang-style batches for the drop-in tests (CPU and GPU): an sglang KV state (slot-major pools,
req_to_token), prefill and decode batches with the indexer's topk_idx in sglang's [Hkv, T, topk] layout, and
the msa_testing.Problem that describes the same attention for the float64 reference.

    state = SglangState(rng, num_reqs=3, max_context=1024, num_qo_heads=8, num_kv_heads=2, head_dim=64, topk=4)
    batch = state.prefill_batch(rng, seq_lens=[300, 700], prefix_lens=[0, 650], slot_ids=[2, 0])
    t = to_torch(batch, device="cpu")                 # torch tensors, float data in bf16
    o_ref, _ = mt.ref_attention(state.problem(batch))

Everything is numpy; float data are float32 values rounded to bf16. Page size = sparse block = 128.
"""
from __future__ import annotations

import math

import numpy as np

import msa_testing as mt

BLOCK = mt.BLOCK


def selection(rng, positions, kv_lens, num_kv_heads: int, topk: int) -> np.ndarray:
    """int32 [Hkv, T, topk] in sglang's layout: per token and KV head its own block plus random earlier
    ones, shuffled, with -1 slots anywhere (rows of tokens with no key are all -1)."""
    T = len(positions)
    idx = np.full((num_kv_heads, T, topk), -1, np.int32)
    for t in range(T):
        nvalid = math.ceil(int(kv_lens[t]) / BLOCK)
        if nvalid == 0:
            continue
        own = min(int(positions[t]) // BLOCK, nvalid - 1)
        for g in range(num_kv_heads):
            take = int(rng.integers(0, min(topk - 1, own) + 1))
            earlier = rng.choice(own, size=take, replace=False) if take else np.zeros(0, np.int64)
            row = np.full(topk, -1, np.int32)
            row[rng.permutation(topk)[:take + 1]] = np.concatenate([[own], earlier])
            idx[g, t] = row
    return idx


class SglangState:
    """sglang's KV bookkeeping: K/V pools [max_slots, Hkv, D], and req_to_token [pool_rows, max_context]
    mapping each request row's token positions to slots of whole pages, scattered over the pool."""

    def __init__(self, rng, *, num_reqs: int, max_context: int, num_qo_heads: int, num_kv_heads: int,
                 head_dim: int, topk: int, spare_pages: int = 3):
        self.num_qo_heads, self.num_kv_heads, self.head_dim, self.topk = num_qo_heads, num_kv_heads, head_dim, topk
        self.page_size = BLOCK
        self.max_context = max_context
        pages_per_req = math.ceil(max_context / BLOCK)
        num_pages = num_reqs * pages_per_req + spare_pages
        shape = (num_pages * BLOCK, num_kv_heads, head_dim)
        self.k_pool = mt.round_to(rng.standard_normal(shape), "bf16")
        self.v_pool = mt.round_to(rng.standard_normal(shape), "bf16")
        perm = rng.permutation(num_pages)
        self.req_to_token = np.zeros((num_reqs + 1, max_context), np.int32)  # row num_reqs stays unused
        pos = np.arange(max_context)
        for r in range(num_reqs):
            pages = perm[r * pages_per_req:(r + 1) * pages_per_req]
            self.req_to_token[r] = pages[pos // BLOCK] * BLOCK + pos % BLOCK

    def write_token(self, rng, slot_id: int, position: int) -> tuple[int, np.ndarray, np.ndarray]:
        """New K and V rows ([Hkv, D]) for the token at `position` of request row slot_id, written into the
        pools; returns (slot, k_row, v_row) for mirroring into device pools."""
        slot = int(self.req_to_token[slot_id, position])
        shape = (self.num_kv_heads, self.head_dim)
        self.k_pool[slot] = mt.round_to(rng.standard_normal(shape), "bf16")
        self.v_pool[slot] = mt.round_to(rng.standard_normal(shape), "bf16")
        return slot, self.k_pool[slot], self.v_pool[slot]

    def prefill_batch(self, rng, *, seq_lens, prefix_lens, slot_ids) -> dict:
        """A chunk of seq_len - prefix_len new tokens per request, after a cached prefix of prefix_len."""
        seq_lens = np.asarray(seq_lens, np.int32)
        prefix_lens = np.asarray(prefix_lens, np.int32)
        qo_lens = seq_lens - prefix_lens
        cu = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
        positions = np.concatenate([p + np.arange(n) for p, n in zip(prefix_lens, qo_lens)])
        kv_of_token = np.repeat(seq_lens, qo_lens)
        T = int(cu[-1])
        return {
            "q": mt.round_to(rng.standard_normal((T, self.num_qo_heads, self.head_dim)), "bf16"),
            "topk_idx": selection(rng, positions, kv_of_token, self.num_kv_heads, self.topk),
            "slot_ids": np.asarray(slot_ids, np.int64),
            "cu_seqlens": cu,
            "seq_lens": seq_lens,
            "prefix_lens": prefix_lens,
        }

    def decode_batch(self, rng, *, seq_lens, slot_ids) -> dict:
        """One query per request at position seq_len - 1 (a request with seq_len 0 is padding)."""
        seq_lens = np.asarray(seq_lens, np.int32)
        B = len(seq_lens)
        return {
            "q": mt.round_to(rng.standard_normal((B, self.num_qo_heads, self.head_dim)), "bf16"),
            "topk_idx": selection(rng, seq_lens - 1, seq_lens, self.num_kv_heads, self.topk),
            "slot_ids": np.asarray(slot_ids, np.int64),
            "cu_seqlens": np.arange(B + 1, dtype=np.int32),
            "seq_lens": seq_lens,
            "prefix_lens": np.maximum(seq_lens - 1, 0),
        }

    def problem(self, batch: dict, sm_scale: float | None = None) -> mt.Problem:
        """The batch as an msa_testing.Problem over the current pools (causal, the chunk of each request
        starting at prefix_len)."""
        P = self.page_size
        seq_lens, slot_ids = batch["seq_lens"], batch["slot_ids"]
        width = max(math.ceil(self.max_context / P), 1)
        page_table = np.full((len(seq_lens), width), -1, np.int32)
        for b, (n, row) in enumerate(zip(seq_lens, slot_ids)):
            pages = math.ceil(int(n) / P)
            page_table[b, :pages] = self.req_to_token[row, :pages * P:P] // P
        num_pages = self.k_pool.shape[0] // P
        view = (num_pages, P, self.num_kv_heads, self.head_dim)
        return mt.Problem(
            q=batch["q"], k_cache=self.k_pool.reshape(view).transpose(0, 2, 1, 3),
            v_cache=self.v_pool.reshape(view).transpose(0, 2, 1, 3), page_table=page_table, page_indptr=None,
            qo_indptr=batch["cu_seqlens"], kv_lens=seq_lens,
            qo_offset=np.minimum(batch["prefix_lens"], seq_lens).astype(np.int32),
            block_idx=batch["topk_idx"].transpose(1, 0, 2), num_qo_heads=self.num_qo_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, head_dim_v=self.head_dim, page_size=P,
            topk=self.topk, causal=True, sm_scale=sm_scale or 1.0 / math.sqrt(self.head_dim))


def to_torch(arrays: dict, device, dtype=None) -> dict:
    """torch copies of numpy arrays on `device`: float arrays in `dtype` (default bfloat16), integer ones as is."""
    import torch

    dt = dtype or torch.bfloat16
    out = {}
    for name, a in arrays.items():
        t = torch.from_numpy(np.ascontiguousarray(a))
        out[name] = t.to(device=device, dtype=dt) if a.dtype.kind == "f" else t.to(device=device)
    return out

