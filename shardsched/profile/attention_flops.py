"""FLOP formulas for SDPA that price causal attention as such ([Note: causal attention FLOPs]
in `profile/analytic.py`).

torch's FlopCounterMode counts every SDPA kernel's score and PV matmuls over the full
s_q x s_k ("NB: We aren't accounting for causal attention here", torch/utils/flop_counter.py),
so a traced causal model is charged twice the attention work its kernels do. These formulas
take the kernels' own `is_causal` argument and keep the computed triangle only; they are
drop-in entries for `FlopCounterMode(custom_mapping=...)` (shape arguments, as FlopCounterMode
passes them), so the traced profile (`profile/trace.py`'s `_CUSTOM`) and the analytic one
count the same FLOPs.
"""
from __future__ import annotations

import torch
import torch.utils.flop_counter as fc

from shardsched.profile.analytic import causal_share

_aten = torch.ops.aten


def _query_heads(query, *shapes) -> tuple:
    """`shapes` (batch, heads, seq, dim) with the query's heads: grouped-query attention
    broadcasts each K/V head to its group of query heads, so the work is per query head.
    torch >= 2.12's counters take fewer K/V heads and count exactly this; torch 2.11's
    assert equal heads, and a GQA model (Llama with num_key_value_heads) failed to trace."""
    return tuple((s[0], query[1], *s[2:]) for s in shapes)


def _flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, *args, out_val=None, **kwargs) -> int:
    """aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, ...)."""
    return int(fc.sdpa_flop_count(query, *_query_heads(query, key, value))
               * causal_share(query[-2], key[-2], is_causal))


def _flash_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False, *args,
                        out_val=None, **kwargs) -> int:
    """aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, dropout_p, is_causal)."""
    return int(fc.sdpa_backward_flop_count(grad_out, query, *_query_heads(query, key, value))
               * causal_share(query[-2], key[-2], is_causal))


CAUSAL_SDPA_FORMULAS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _flash_cpu,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _flash_cpu_backward,
}
"""custom_mapping entries for the CPU flash kernel, the one fake CPU tensors dispatch to."""
