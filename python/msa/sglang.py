"""msa.sglang: the sglang drop-in, msa.engines.sglang under its public name (the same module object)."""
import sys

from .engines import sglang as _engine

sys.modules[__name__] = _engine
