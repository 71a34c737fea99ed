"""Checks of plain Python arguments (ints, host length lists), with messages in the library's
format: "<function>: argument '<name>': expected ..., got ..."."""
from __future__ import annotations

import operator

import numpy as np

from ._framework import torch_of

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def integer(fn: str, name: str, value, bits: int = 32) -> int:
    """value as a Python int (anything with __index__, e.g. numpy integers; not bool, not float) that
    fits a signed integer of `bits` bits, the width of the C++ parameter it feeds."""
    if isinstance(value, bool):
        raise TypeError(f"{fn}: argument '{name}': expected an int, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: argument '{name}': expected an int, got {type(value).__name__}") from None
    if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
        raise ValueError(f"{fn}: argument '{name}': expected a value in the int{bits} range, got {v}")
    return v


def real(fn: str, name: str, value) -> float:
    """value as a Python float (anything with __float__: ints, numpy scalars, one-element tensors; not bool).
    The range is checked by the C++ entry point, which names the argument too; a value beyond the float range
    (an int of 400 digits) is refused here."""
    if type(value) is float:  # the common case, first
        return value
    if isinstance(value, bool) or not hasattr(value, "__float__"):  # float() would also parse strings
        raise TypeError(f"{fn}: argument '{name}': expected a float, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{fn}: argument '{name}': expected a finite float, got a {type(value).__name__} beyond the "
                         f"float range") from None
    except TypeError as e:  # e.g. a numpy array of more than one element
        raise TypeError(f"{fn}: argument '{name}': expected a float, got {type(value).__name__} ({e})") from None


def sm_scale_value(fn: str, sm_scale) -> float:
    """The logit scale for the C++ entry points: 0.0 for None (their default, head_dim ** -0.5), else the value,
    which must stay nonzero as a float32 (the C++ parameter's type: 1e-300 would become 0, the default)."""
    if sm_scale is None:
        return 0.0
    scale = sm_scale if type(sm_scale) is float else real(fn, "sm_scale", sm_scale)
    if abs(scale) <= 2.0**-150:  # rounds to 0 in float32 (its smallest subnormal is 2^-149)
        raise ValueError(f"{fn}: argument 'sm_scale': expected a nonzero finite number representable in float32 "
                         f"(or None), got {sm_scale}")
    return scale


_MAX_TOPK = 1 << 20  # select_topk's and merge_candidates' bound (core/dispatch.cpp, selection_args)


def topk_value(fn: str, topk) -> int:
    """topk of select_topk / merge_candidates as an int in the C++ entry points' range, checked before an output
    [T, H, topk] is allocated."""
    k = integer(fn, "topk", topk)
    if not 1 <= k <= _MAX_TOPK:
        raise ValueError(f"{fn}: argument 'topk': expected 1..{_MAX_TOPK}, got {k}")
    return k



def host_lengths(fn: str, name: str, values) -> np.ndarray:
    """A 1-D host sequence of ints (list, tuple, numpy array, CPU torch tensor) as contiguous int32."""
    torch = torch_of(values)
    if torch is not None:
        if values.device.type != "cpu":
            raise TypeError(f"{fn}: argument '{name}': expected host lengths (a list, numpy array or CPU tensor), "
                            f"got a tensor on {values.device}")
        values = values.detach().numpy()
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"{fn}: argument '{name}': expected a 1-D sequence of ints, got shape {list(a.shape)}")
    if a.size == 0:
        return np.zeros(0, np.int32)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{fn}: argument '{name}': expected integers, got dtype {a.dtype}")
    lo, hi = int(a.min()), int(a.max())
    if lo < _INT32_MIN or hi > _INT32_MAX:
        bad = lo if lo < _INT32_MIN else hi
        raise ValueError(f"{fn}: argument '{name}': expected values in the int32 range, got {bad}")
    return np.ascontiguousarray(a, dtype=np.int32)
