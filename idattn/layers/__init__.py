"""idattn.layers: Flax modules that own parameters (the math lives in idattn.ops)."""
from idattn.layers.attention import SoftmaxAttention, causal_attention
from idattn.layers.common import (Dense, HeadNorm, RMSNorm, ShortConv, SwiGLU, param,
                                  positions_from_segments, rope)
from idattn.layers.interdomain import InterdomainMixer, xi

__all__ = ["Dense", "HeadNorm", "RMSNorm", "ShortConv", "SwiGLU", "SoftmaxAttention", "InterdomainMixer",
           "causal_attention", "param", "positions_from_segments", "rope", "xi"]
