"""Which framework a tensor belongs to, and what follows from it: output allocation, the default
CUDA stream, host reads of small length tensors.

torch is never imported here: a torch tensor can only exist once torch is in sys.modules, so
`sys.modules.get("torch")` tells torch tensors apart without importing anything.
"""
from __future__ import annotations

import sys

import numpy as np

from . import _C


def torch_of(x):
    """The torch module when x is a torch tensor, else None (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return torch
    return None


def require_torch(module: str, what: str):
    """The torch module, imported for `module` (the torch-only parts of msa: the engine drop-ins and
    msa.torch_ops). Without torch: an ImportError (ModuleNotFoundError, name 'torch') that says what needs it
    and what works without it."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise ModuleNotFoundError(
            f"{module} {what} and needs torch: pip install torch. Without torch, msa's core API works on numpy "
            f"arrays (and any DLPack tensor): msa.plan_prefill, msa.plan_decode, msa.attention, msa.block_scores, "
            f"msa.select_topk, msa.merge_candidates, msa.sparse_attention_layer, msa.merge_states, "
            f"msa.build_page_table, msa.write_cache",
            name="torch") from e
    return torch


def _type_name(x) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


def new_output(fn: str, name: str, like, like_name: str, shape, dtype: str):
    """An uninitialized output `name` of `shape` in the framework and on the device of the argument
    `like_name` (the call's first tensor, `like`).

    dtype: "like" (like's dtype), "float32" or "int32". numpy inputs give numpy outputs (a bfloat16
    `like` from ml_dtypes gives an ml_dtypes bfloat16 output); torch inputs give torch outputs on
    like's device. Other frameworks cannot be allocated for: the caller passes the output.
    """
    if like is None:
        raise ValueError(f"{fn}: argument '{like_name}' is required")
    shape = tuple(int(s) for s in shape)
    if isinstance(like, np.ndarray):
        return np.empty(shape, like.dtype if dtype == "like" else np.dtype(dtype))
    torch = torch_of(like)
    if torch is not None:
        dt = like.dtype if dtype == "like" else getattr(torch, dtype)
        return torch.empty(shape, dtype=dt, device=like.device)
    if not hasattr(like, "__dlpack__"):
        raise TypeError(f"{fn}: argument '{like_name}': expected a DLPack tensor (numpy array, torch tensor, ...), "
                        f"got {_type_name(like)}")
    raise TypeError(f"{fn}: argument '{name}' is required for inputs of type {_type_name(like)}: msa allocates "
                    f"outputs only for numpy arrays and torch tensors")


# The stream argument of msa._C's calls that stands for torch's current stream of the call's first tensor's
# device, which msa._C asks torch for through its DLPack C exchange API (torch >= 2.10; well under 1 us, against
# ~4.7 us for torch.cuda.current_stream on the H200 machine, bench/run_host.py).
CURRENT_STREAM = -1


def resolve_stream(fn: str, stream, like) -> int:
    """The CUDA stream handle to launch on. None: torch's current stream of like's device when like
    is a torch CUDA tensor (CURRENT_STREAM where msa._C resolves it itself), else 0 (the default stream; ignored for
    CPU tensors). An int is a raw cudaStream_t; stream objects are read through .cuda_stream (torch) or
    .ptr (cupy)."""
    if stream is None:
        torch = torch_of(like)
        if torch is not None and like.is_cuda:
            if _C._current_stream_through_api(like):
                return CURRENT_STREAM
            return torch.cuda.current_stream(like.device).cuda_stream
        return 0
    handle = stream
    if not isinstance(stream, int):
        handle = getattr(stream, "cuda_stream", None)
        if not isinstance(handle, int):
            handle = getattr(stream, "ptr", None)
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise TypeError(f"{fn}: argument 'stream': expected None, an int cudaStream_t or a stream object with "
                        f".cuda_stream or .ptr, got {_type_name(stream)}")
    if not 0 <= handle < 2**63:  # the binding's int64
        raise ValueError(f"{fn}: argument 'stream': expected a cudaStream_t handle in [0, 2^63), got {handle}")
    return handle


def host_max(fn: str, name: str, x, instead: str) -> int:
    """max(x) of a small int32 tensor read on the host (0 when empty). A CUDA tensor is refused,
    because reading it would wait on the device; `instead` says which argument avoids the read."""
    if x is None:
        raise ValueError(f"{fn}: argument '{name}' is required")
    torch = torch_of(x)
    if torch is not None:
        if x.device.type != "cpu":
            raise ValueError(f"{fn}: argument '{name}' is on {x.device} and reading it would wait on the device: "
                             f"pass {instead}")
        if x.dtype != torch.int32:
            raise TypeError(f"{fn}: argument '{name}': expected dtype int32, got {x.dtype}")
        return int(x.max()) if x.numel() else 0
    try:
        a = np.asarray(x)
    except Exception as e:  # e.g. cupy refuses implicit host copies
        raise ValueError(f"{fn}: argument '{name}' ({_type_name(x)}) cannot be read on the host: pass {instead}") \
            from e
    # As the C++ checks would say, before this read chokes on floats or strings (a list of ints goes on to the
    # binding, which refuses it as no tensor).
    if a.dtype != np.int32 and (isinstance(x, np.ndarray) or a.dtype.kind not in "iu"):
        raise TypeError(f"{fn}: argument '{name}': expected dtype int32, got {a.dtype}")
    return int(a.max()) if a.size else 0


def cpu_ints(x):
    """A CPU tensor (numpy, torch, any DLPack CPU tensor) of integers as a numpy array, or None where x is not
    one that can be read without a device wait (CUDA tensors, other dtypes: the C++ checks report those)."""
    torch = torch_of(x)
    if torch is not None:
        return x.detach().numpy() if x.device.type == "cpu" and not x.is_floating_point() else None
    try:
        a = np.asarray(x) if isinstance(x, np.ndarray) else np.from_dlpack(x)
    except Exception:  # noqa: BLE001 (a device tensor, or no DLPack): not host-readable here
        return None
    return a if a.dtype.kind in "iu" else None
