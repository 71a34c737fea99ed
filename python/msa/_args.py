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
    The range is checked by the C++ entry point, which names the argument too."""
    if isinstance(value, bool) or not hasattr(value, "__float__"):  # float() would also parse strings
        raise TypeError(f"{fn}: argument '{name}': expected a float, got {type(value).__name__}")
    return float(value)


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
