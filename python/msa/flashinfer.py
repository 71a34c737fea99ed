"""msa.flashinfer: the FlashInfer msa_ops drop-in, msa.engines.flashinfer under its public name (the same module
object)."""
import sys

from .engines import flashinfer as _engine

sys.modules[__name__] = _engine
