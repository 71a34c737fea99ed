"""msa.engines: drop-ins for serving engines, on torch tensors; they need torch, msa's core does not.

    fmha_sm100   MiniMax's fmha_sm100 API (fmha_sm100_plan, fmha_sm100, sparse_topk_select)
    flashinfer   FlashInfer's msa_ops API as vLLM calls it (msa_proxy_score, msa_topk_select, msa_sparse_attention,
                 msa_sparse_decode_attention)
    sglang       sglang's MiniMax-M3 MSA functions (msa_sparse_prefill_main, msa_sparse_decode_main, ...)

Each is imported as msa.<name> too (msa/fmha_sm100.py, msa/flashinfer.py and msa/sglang.py are aliases of these
modules).
"""
