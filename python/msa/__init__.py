"""msa: MiniMax-M3-style block-sparse attention (CUDA kernels, a CPU reference, DLPack bindings).

    plan = msa.plan_prefill(qo_lens, kv_lens, num_qo_heads=64, num_kv_heads=4, topk=16, device="cuda")
    o = msa.attention(plan, q, k_cache, v_cache, page_table, qo_indptr, kv_lens, block_idx=block_idx)

Tensors of any DLPack framework are accepted; CPU tensors run the reference backend, CUDA tensors the
GPU kernels. Errors: ValueError (shapes, lengths, strides), TypeError (dtypes, device kinds),
NotImplementedError (valid input this build or device cannot run), RuntimeError (CUDA failures).
"Any strides" in the docstrings means any non-negative ones (a negative stride raises ValueError).
Importing msa never imports torch. The semantics are those of docs/python_api.md.

Beside this core, the torch-only modules: msa.torch_ops (the entry points as torch custom ops),
msa.distributed (the indexer and sparse attention sharded over torch.distributed ranks) and the
serving-engine drop-ins of msa.engines, imported as msa.sglang, msa.fmha_sm100 and msa.flashinfer.
"""
from ._C import cuda_available, cuda_compute_capability
from .ops import attention, block_scores, build_page_table, merge_candidates, merge_states, select_topk
from .ops import sparse_attention_layer
from .ops import write_cache
from .plan import Plan, plan_decode, plan_prefill

__version__ = "0.1.0"

__all__ = [
    "Plan",
    "attention",
    "block_scores",
    "build_page_table",
    "cuda_available",
    "cuda_compute_capability",
    "merge_candidates",
    "merge_states",
    "plan_decode",
    "plan_prefill",
    "select_topk",
    "sparse_attention_layer",
    "write_cache",
]
