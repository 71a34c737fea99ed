"""One rank of the torchrun test (test_torchrun_distributed.py): NCCL group over the visible GPUs, every rank
builds the same batch, runs the sharded decode and prefill layers and the sharded indexer over the group (the
decode layer also captured in a CUDA graph with its NCCL collectives) and compares with its own single-device
results. Exit status 0 when every rank agrees."""
import os
import sys

import numpy as np
import torch
import torch.distributed as tdist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import msa.distributed as dist  # noqa: E402
import msa_testing as mt  # noqa: E402
from distributed_testing import make_batch, reference  # noqa: E402


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    tdist.init_process_group("nccl")
    topk = 16
    for phase, qo, kv, max_kv in [("decode", [1, 1, 4, 1], [9000, 300, 5000, 129], 9216),
                                  ("prefill", [700, 1, 300], [2900, 513, 300], 2944)]:
        rng = np.random.default_rng(11)
        batch = make_batch(torch, rng, qo, kv, head_dim=128, page_size=64, device="cuda")
        o_ref, bi_ref = reference(batch, phase, topk, max_kv)
        sh = dist.Shard.round_robin(rank, world, len(kv), -(-max_kv // 128), "cuda")
        table = dist.shard_page_table(batch["page_table"], sh, 64)
        pk = dict(num_qo_heads=batch["hq"], num_kv_heads=batch["hkv"], page_size=64, topk=topk)
        if phase == "decode":
            T = batch["q"].shape[0]
            step = dist.DecodeStep(sh, table, batch["qo_indptr"], batch["kv_lens"], T)
            plan = step.plan(**pk)
        else:
            step = dist.PrefillStep(sh, table, qo, kv)
            plan = step.plans(**pk)

        def layer():
            return dist.sharded_layer(None, step, plan, batch["q"], batch["k_cache"], batch["v_cache"],
                                      batch["q_index"], batch["k_index"], topk, return_block_idx=True)

        o, bi = layer()
        np.testing.assert_array_equal(bi.cpu().numpy(), bi_ref.cpu().numpy())
        mt.assert_close(o.float().cpu().numpy(), o_ref.float().cpu().numpy())
        bi2 = dist.sharded_indexer(None, step, batch["q_index"], batch["k_index"], topk)
        np.testing.assert_array_equal(bi2.cpu().numpy(), bi_ref.cpu().numpy())
        if phase == "decode":
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                og, big = layer()
            g.replay()
            torch.cuda.synchronize()
            np.testing.assert_array_equal(big.cpu().numpy(), bi_ref.cpu().numpy())
            mt.assert_close(og.float().cpu().numpy(), o_ref.float().cpu().numpy())
    tdist.barrier()
    tdist.destroy_process_group()
    print(f"rank {rank}: ok")


if __name__ == "__main__":
    main()
