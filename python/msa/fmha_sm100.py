"""msa.fmha_sm100: the fmha_sm100 drop-in, msa.engines.fmha_sm100 under its public name (the same module
object)."""
import sys

from .engines import fmha_sm100 as _engine

sys.modules[__name__] = _engine
