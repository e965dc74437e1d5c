"""GPTConfig: the shape of a GPT, free of torch so planning a 175B model from a
preset does not have to import it (`shardsched plan` answers in well under 2 s)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    vocab: int = 256
    """Vocabulary size (256 for byte-level text)."""
    layers: int = 4
    """Number of transformer blocks."""
    hidden: int = 128
    """Model width h."""
    heads: int = 4
    """Attention heads; must divide hidden."""
    ffn: int = 0
    """MLP inner width; 0 means 4*hidden."""
    seq: int = 128
    """Maximum sequence length (size of the position embedding)."""
    mlp: str = "gelu"
    """"gelu" (GPT: fc, proj) or "swiglu" (LLaMA: gate, up, down)."""
    norm: str = "layernorm"
    """"layernorm" (weight and bias) or "rmsnorm" (weight only)."""
    bias: bool = True
    """Biases in linear layers (GPT-2 yes, LLaMA no)."""
    learned_pos: bool = True
    """Learned position embedding (GPT-2); False for rotary-style models (none stored)."""

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden
