"""Problems for the sharded indexer and layer (msa.distributed): a paged batch with index keys, the single-device
result of msa.sparse_attention_layer, and the per-rank views of N emulated ranks over the same pool."""
import math

import numpy as np

import msa
import msa_testing as mt

BLOCK = 128


def make_batch(torch, rng, qo_lens, kv_lens, *, qo_offset=None, hkv=2, group=4, head_dim=64, page_size=64,
               device="cpu", dtype=None, index_fp8=False):
    """Random q / K / V / index tensors over a shuffled page pool, dense page table."""
    dtype = dtype or torch.bfloat16
    B = len(kv_lens)
    pages_per = [math.ceil(k / page_size) for k in kv_lens]
    max_pages = max(pages_per) + 1
    num_pages = sum(pages_per) + 3
    perm = rng.permutation(num_pages)
    table = np.full((B, max_pages), -1, np.int32)
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = perm[at:at + n]
        at += n
    T = int(sum(qo_lens))
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 31)))

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    batch = dict(
        q=randn(T, hkv * group, head_dim), k_cache=randn(num_pages, hkv, page_size, head_dim),
        v_cache=randn(num_pages, hkv, page_size, head_dim), q_index=randn(T, hkv, head_dim),
        page_table=torch.tensor(table, device=device),
        qo_indptr=torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device=device),
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
        qo_offset=None if qo_offset is None else torch.tensor(qo_offset, dtype=torch.int32, device=device),
        qo_lens=list(qo_lens), kv_lens_host=list(kv_lens), qo_offset_host=qo_offset,
        hkv=hkv, hq=hkv * group, head_dim=head_dim, page_size=page_size)
    k_index = torch.randn(num_pages, 1, page_size, head_dim, generator=gen)
    if index_fp8:
        scale = k_index.abs().amax(-1) / 448 + 1e-3
        batch["k_index"] = (k_index / scale[..., None]).to(torch.float8_e4m3fn).to(device)
        batch["k_index_scale"] = scale.to(torch.float32).to(device)
    else:
        batch["k_index"] = k_index.to(dtype).to(device)
        batch["k_index_scale"] = None
    return batch


def single_device(batch, plan, topk, *, force_begin=0, force_end=1):
    """msa.sparse_attention_layer: (o, block_idx)."""
    return msa.sparse_attention_layer(
        plan, batch["q"], batch["k_cache"], batch["v_cache"], batch["q_index"], batch["k_index"],
        batch["page_table"], batch["qo_indptr"], batch["kv_lens"], k_index_scale=batch["k_index_scale"],
        qo_offset=batch["qo_offset"], force_begin=force_begin, force_end=force_end, return_block_idx=True)


def shards(torch, layout, world, batch, max_blocks, rng, device="cpu"):
    """One msa.distributed.Shard per rank: round-robin blocks, or contiguous uneven ranges (random cuts within
    each request's blocks, empty shards allowed; the last rank owns everything past the request's end)."""
    from msa import distributed as dist
    B = len(batch["kv_lens_host"])
    if layout == "round_robin":
        return [dist.Shard.round_robin(r, world, B, max_blocks, device) for r in range(world)]
    if layout == "owner":  # any owner map: a random rank per block
        owner = torch.tensor(rng.integers(0, world, size=(B, max_blocks)), device=device)
        return [dist.Shard.from_owner(owner, r, world) for r in range(world)]
    bounds = np.zeros((B, world + 1), np.int64)
    for b, kv in enumerate(batch["kv_lens_host"]):
        nb = math.ceil(kv / BLOCK)
        bounds[b, 1:world] = np.sort(rng.integers(0, nb + 1, size=world - 1))
        bounds[b, world] = max_blocks
    return [dist.Shard.contiguous(r, bounds, max_blocks, device) for r in range(world)]


def run_emulated(torch, batch, shard_list, phase, topk, *, force_begin=0, force_end=1, causal=True):
    from msa import distributed as dist
    kw = dict(num_qo_heads=batch["hq"], num_kv_heads=batch["hkv"], head_dim=batch["head_dim"],
              page_size=batch["page_size"], topk=topk)
    steps, plans = [], []
    for sh in shard_list:
        table = dist.shard_page_table(batch["page_table"], sh, batch["page_size"])
        if phase == "decode":
            st = dist.DecodeStep(sh, table, batch["qo_indptr"], batch["kv_lens"], batch["q"].shape[0],
                                 qo_offset=batch["qo_offset"], causal=causal)
            plans.append(st.plan(**kw))
        else:
            st = dist.PrefillStep(sh, table, batch["qo_lens"], batch["kv_lens_host"],
                                  qo_offset=batch["qo_offset_host"], causal=causal)
            plans.append(st.plans(**kw))
        steps.append(st)
    k = [batch["k_cache"]] * len(steps)   # emulated ranks address one pool through their local tables
    v = [batch["v_cache"]] * len(steps)
    ki = [batch["k_index"]] * len(steps)
    ks = None if batch["k_index_scale"] is None else [batch["k_index_scale"]] * len(steps)
    return dist.emulate_layer(steps, plans, batch["q"], k, v, batch["q_index"], ki, topk, k_index_scales=ks,
                              force_begin=force_begin, force_end=force_end)


def reference(batch, phase, topk, max_kv, **kw):
    pk = dict(num_qo_heads=batch["hq"], num_kv_heads=batch["hkv"], head_dim=batch["head_dim"],
              page_size=batch["page_size"], topk=topk, device=batch["q"].device)
    if phase == "decode":
        plan = msa.plan_decode(len(batch["kv_lens_host"]), max(batch["qo_lens"]), max_kv, **pk)
    else:
        plan = msa.plan_prefill(batch["qo_lens"], batch["kv_lens_host"], qo_offset=batch["qo_offset_host"], **pk)
    return single_device(batch, plan, topk, **kw)


def check(torch, batch, phase, layout, world, topk, rng, max_kv, **kw):
    o_ref, bi_ref = reference(batch, phase, topk, max_kv, **kw)
    max_blocks = math.ceil(max_kv / 128)
    o, bi = run_emulated(torch, batch, shards(torch, layout, world, batch, max_blocks, rng, batch['q'].device),
                         phase, topk, **kw)
    np.testing.assert_array_equal(bi.cpu().numpy(), bi_ref.cpu().numpy())
    mt.assert_close(o.float().cpu().numpy(), o_ref.float().cpu().numpy())
