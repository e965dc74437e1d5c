"""Analytic profiles: per-layer parameters, times and activations from a GPT config.

For clusters and models you don't have: nothing is built, so gpt3-175b takes
milliseconds. Layer names, parameter names and shapes follow
`shardsched.models.gpt.GPT` exactly (tests compare them with the real module),
so the fingerprint, and therefore a plan made from this profile, matches the
real model.

Time model: FLOPs per op class at that class's efficiency
(`DeviceSpec.compute_seconds`: "matmul" and "attention"; a class the device does
not list runs at `mfu`). A linear layer with P weights costs 2*P FLOPs per token
forward (Kaplan et al. 2020, "Scaling laws", Sec. 2.1) and twice that backward
(input and weight gradients). Attention adds QK^T and AV: 2 matmuls * 2 FLOPs *
b*s^2*h forward without a mask; the model is causal, and the kernels it runs skip
the masked half (FlashAttention-2's causal tiles; PyTorch's CPU flash kernel stops
each query block at the diagonal), so it is priced at the lower triangle, s(s+1)/2
of s^2 ([Note: causal attention FLOPs]), its backward at 2.5x. Published MFU figures
(Megatron-LM, Narayanan et al. 2021, eq. 3; llm-foundry; torchtitan) count the
unmasked 4*b*s^2*h: compare throughput, not MFUs.
"""
from __future__ import annotations

import dataclasses

from shardsched.cost.device import DeviceSpec
from shardsched.errors import UsageError
from shardsched.profile.fingerprint import fingerprint_of_shapes
from shardsched.models.spec import config_dict
from shardsched.profile.types import LayerProfile, Profile
from shardsched.profile.workspace_terms import above_model
from shardsched.models.gpt_config import GPTConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# Memory bandwidth for the memory-bound pieces (embedding gather, norms), from
# vendor datasheets: V100 SXM2 900 GB/s, A100 80GB 2.0 TB/s, H100 SXM 3.35 TB/s, H200 4.8 TB/s;
# ~20 GB/s for a 2-core CPU. Unknown devices: flops / 100 (a roofline ridge point).
_MEMORY_BANDWIDTH = {"cpu": 20e9, "v100": 900e9, "a100": 2.0e12, "h100": 3.35e12, "h200": 4.8e12}

Shapes = list[tuple[str, tuple[int, ...]]]


# ---------------------------------------------------------------- parameters

def _norm_shapes(prefix: str, cfg: GPTConfig) -> Shapes:
    # nn.LayerNorm always has a bias (cfg.bias is about Linear layers); nn.RMSNorm has none.
    shapes = [(f"{prefix}.weight", (cfg.hidden,))]
    if cfg.norm != "rmsnorm":
        shapes.append((f"{prefix}.bias", (cfg.hidden,)))
    return shapes


def _linear_shapes(prefix: str, cfg: GPTConfig, n_in: int, n_out: int, *, bias: bool) -> Shapes:
    shapes = [(f"{prefix}.weight", (n_out, n_in))]
    if bias:
        shapes.append((f"{prefix}.bias", (n_out,)))
    return shapes


def _block_children_shapes(prefix: str, cfg: GPTConfig) -> dict[str, Shapes]:
    """Shapes of one block, grouped by child module in registration order (ln1, attn, ln2, mlp)."""
    h, f, b = cfg.hidden, cfg.ffn_size, cfg.bias
    attn = _linear_shapes(f"{prefix}.attn.qkv", cfg, h, 3 * h, bias=b) + \
        _linear_shapes(f"{prefix}.attn.proj", cfg, h, h, bias=b)
    if cfg.mlp == "swiglu":
        mlp = _linear_shapes(f"{prefix}.mlp.gate", cfg, h, f, bias=b) + \
            _linear_shapes(f"{prefix}.mlp.up", cfg, h, f, bias=b) + \
            _linear_shapes(f"{prefix}.mlp.down", cfg, f, h, bias=b)
    else:
        mlp = _linear_shapes(f"{prefix}.mlp.fc", cfg, h, f, bias=b) + \
            _linear_shapes(f"{prefix}.mlp.proj", cfg, f, h, bias=b)
    return {f"{prefix}.ln1": _norm_shapes(f"{prefix}.ln1", cfg), f"{prefix}.attn": attn,
            f"{prefix}.ln2": _norm_shapes(f"{prefix}.ln2", cfg), f"{prefix}.mlp": mlp}


def _layer_children_shapes(cfg: GPTConfig) -> dict[str, dict[str, Shapes]]:
    """layer name -> child name -> shapes, all in GPT's registration order."""
    embed = {"embed.tok": [("embed.tok.weight", (cfg.vocab, cfg.hidden))]}
    if cfg.learned_pos:
        embed["embed.pos"] = [("embed.pos.weight", (cfg.seq, cfg.hidden))]
    layers = {"embed": embed}
    for i in range(cfg.layers):
        layers[f"blocks.{i}"] = _block_children_shapes(f"blocks.{i}", cfg)
    layers["head"] = {"head.ln": _norm_shapes("head.ln", cfg),
                      "head.out": [("head.out.weight", (cfg.vocab, cfg.hidden))]}
    return layers


def gpt_param_shapes(config: GPTConfig) -> Shapes:
    """[(name, shape)] exactly as `GPT(config).named_parameters()` yields them."""
    return [s for children in _layer_children_shapes(config).values()
            for shapes in children.values() for s in shapes]


def _count(shapes: Shapes) -> int:
    total = 0
    for _, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


# ---------------------------------------------------------------- activations
# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
# Transformer Models", eq. 1) count s*b*h*(34 + 5*a*s/h) bytes per 16-bit GPT
# layer: that includes three dropout masks and the materialised s x s softmax,
# its dropout mask and output (the 5*a*s/h term). Our blocks have no dropout and
# call F.scaled_dot_product_attention, whose flash / memory-efficient kernels
# save q, k, v, the output and a per-row logsumexp instead of any s x s matrix.
# Counting what THIS implementation saves (checked with saved_tensors_hooks in
# tests/profile/test_analytic.py), in units of T*h*d (T = b*s tokens, d = dtype
# bytes): gelu block 8 + 2*f/h (16 for f = 4h, i.e. 32 sbh bytes in 16 bits vs
# Korthikanti's 34 + 5as/h), swiglu block 8 + 4*f/h, plus norm statistics and
# the fp32 logsumexp. Storages are counted once: q, k, v are views of the qkv
# output, and the attention output is the out-projection's saved input.

def _fused_rmsnorm(device: DeviceSpec) -> bool:
    """On GPUs, nn.RMSNorm runs aten::_fused_rms_norm, which saves input and
    rstd; on CPU it runs the composite form (torch/_decomp/decompositions.py),
    which saves an fp32 copy of the input and the fp32 normalised tensor."""
    return device.name != "cpu"


def _norm_act(cfg: GPTConfig, tokens: int, d: int, fused_rms: bool) -> int:
    h = cfg.hidden
    if cfg.norm == "rmsnorm":
        if fused_rms:
            return tokens * h * d + 4 * tokens  # input, fp32 rstd
        return 2 * tokens * h * max(d, 4) + 4 * tokens  # fp32 input, normalised, rstd
    return tokens * h * d + 2 * 4 * tokens  # input, fp32 mean and rstd


def _attn_act(cfg: GPTConfig, *, b: int, s: int, d: int) -> int:
    """qkv input, qkv output (= q, k, v views), attention output (= proj input), fp32 logsumexp."""
    tokens, h = b * s, cfg.hidden
    return 5 * tokens * h * d + 4 * b * cfg.heads * s


def _mlp_act(cfg: GPTConfig, tokens: int, d: int) -> int:
    """gelu: input, fc output (gelu's input), gelu output (proj's input).
    swiglu: input (shared by gate and up), gate out, silu out, up out, product."""
    per_ffn = 4 if cfg.mlp == "swiglu" else 2
    return tokens * cfg.hidden * d + per_ffn * tokens * cfg.ffn_size * d


# ---------------------------------------------------------------- layers

# [Note: causal attention FLOPs]
# The score and PV matmuls of causal attention compute only the lower triangle: s(s+1)/2
# of the s^2 score entries, about s^2/2. Flash kernels skip the tiles the mask removes whole
# (FlashAttention-2, Dao 2023: blocks whose column indices all exceed their row indices are
# not computed); so does PyTorch's CPU kernel (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp,
# `num_keys = is_causal ? std::min(m + qBlockSize, kvSize) : kvSize`). FlopCounterMode's SDPA
# formulas count the full s^2 ("NB: We aren't accounting for causal attention here",
# torch/utils/flop_counter.py); `causal_attention_flops` here and `profile.attention_flops`'s
# FlopCounterMode formulas (for traced profiles) count the computed triangle instead.
ATTENTION_BACKWARD = 2.5
"""Backward / forward FLOPs of flash attention: it recomputes the scores and runs four gradient
matmuls, five against the forward's two (FlopCounterMode's `sdpa_backward_flop_count` alike)."""


def causal_share(s_q: int, s_k: int, is_causal: bool) -> float:
    """Share of the s_q x s_k score matrix a causal kernel computes: the ones of
    `ones(s_q, s_k).tril()` (SDPA's is_causal mask, top-left aligned); s(s+1)/2 of s^2
    for self-attention."""
    if not is_causal:
        return 1.0
    rows = min(s_q, s_k)
    return (rows * (rows + 1) / 2 + (s_q - rows) * s_k) / (s_q * s_k)


def causal_attention_flops(*, b: int, s: int, h: int, causal: bool = True) -> float:
    """Forward FLOPs of softmax(QK^T)V over b sequences of s tokens, width h (all heads):
    two matmuls of 2*b*s^2*h FLOPs each, the lower triangle of them when causal. Its backward is
    `ATTENTION_BACKWARD` times this."""
    return 2 * 2 * b * s * s * h * causal_share(s, s, causal)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Ctx:
    cfg: GPTConfig
    b: int
    s: int
    d: int
    device: DeviceSpec
    bandwidth: float
    fused_rms: bool

    @property
    def tokens(self) -> int:
        return self.b * self.s

    def seconds(self, matmul: float, attention: float = 0.0) -> float:
        """Forward seconds of these FLOPs, each class at the device's efficiency for it."""
        return self.device.compute_seconds({"matmul": matmul, "attention": attention} if attention
                                           else {"matmul": matmul})


def _leaf(name: str, *, params: int, fwd_seconds: float, act: int, largest: int = 0, inp: int = 0,
          bwd_seconds: float | None = None, saved: tuple[int, int] = (0, 0),
          recompute: tuple[float, float] | None = None, workspace: int | None = None,
          out: int = 0) -> LayerProfile:
    """`saved`: what selective checkpointing keeps under `+sac` and `+sac-all`
    (`_selective_saved`); `recompute`: the seconds each recomputes (None: its whole forward,
    no matmul, attention or convolution in it); `workspace`: its backward's transient where it
    is not two of its largest saved tensors; `out`: its output's bytes."""
    rec = (fwd_seconds, fwd_seconds) if recompute is None else recompute
    return LayerProfile(name=name, params=params, forward_seconds=fwd_seconds,
                        backward_seconds=2 * fwd_seconds if bwd_seconds is None else bwd_seconds,
                        activation_bytes=act, workspace_bytes=2 * largest if workspace is None else workspace,
                        input_bytes=inp, output_bytes=out,
                        selective_saved_bytes=saved[0], selective_recompute_seconds=rec[0],
                        selective_all=(saved[1], 0, 0, rec[1]))


def _parent(name: str, children: list[LayerProfile], *, d: int, backward_peak: int, extra_fwd: float = 0.0,
            extra_act: int = 0, extra_bwd: float | None = None, inp: int = 0) -> LayerProfile:
    """A layer whose costs are its children's plus what runs outside them. Its
    workspace comes from `backward_peak`, the bytes its backward holds above its
    activations at its highest (`profile.workspace`, [Note: what the backward workspace
    is]), its gradients being in the compute dtype (`d` bytes)."""
    params, act = sum(c.params for c in children), sum(c.activation_bytes for c in children) + extra_act
    return LayerProfile(
        workspace_bytes=above_model(backward_peak, act, params * d),
        name=name, params=params,
        # the code outside its children (a loss) is memory-bound: selective checkpointing recomputes it
        selective_saved_bytes=sum(c.selective_saved_bytes or 0 for c in children),
        selective_recompute_seconds=sum(c.forward_seconds if c.selective_recompute_seconds is None
                                        else c.selective_recompute_seconds for c in children) + extra_fwd,
        selective_all=(sum(c.selective_all[0] for c in children), 0, 0,
                       sum(c.selective_all[3] for c in children) + extra_fwd),
        forward_seconds=sum(c.forward_seconds for c in children) + extra_fwd,
        backward_seconds=sum(c.backward_seconds for c in children) + (2 * extra_fwd if extra_bwd is None else extra_bwd),
        activation_bytes=act, input_bytes=inp, children=tuple(children))


# [Note: memory-bound work in analytic blocks] (issue 28)
# The traced path prices every op without FLOPs by the bytes it reads and writes
# (`LayerProfile.forward_moved_bytes`) at the device's bandwidth; analytic blocks priced none,
# which made a `gpt:` Llama-2-13B 1.13x faster than the traced `hf:` one. They now price
# the same work, per token, in bf16-element units (bytes / 2) times the compute dtype's size,
# read off the trace of the modules (tests/profile/test_analytic.py checks them against it): a
# fused norm (layer norm; RMSNorm where `_fused_rmsnorm`) 2h forward and 6h backward, the
# composite RMSNorm (fp32 inside) 20h and 55h; attention's layout copies 6h backward, and where a
# spec has no learned positions it stands for a rotary model (Llama), whose attention (HF's
# LlamaAttention with its rotary embedding, traced) moves 22.25h forward and 40.25h backward;
# SwiGLU's silu-and-product 5 ffn forward and 21 ffn + 3h backward, GELU's 2 ffn and 3 ffn; the
# two residual adds 6h forward.

def _moved_elements(cfg: GPTConfig, kind: str, fused_rms: bool) -> tuple[float, float]:
    """(forward, backward) elements per token the memory-bound ops of a block child move
    ([Note: memory-bound work in analytic blocks])."""
    h, f = cfg.hidden, cfg.ffn_size
    if kind in ("ln1", "ln2"):
        return (20.0 * h, 55.0 * h) if cfg.norm == "rmsnorm" and not fused_rms else (2.0 * h, 6.0 * h)
    if kind == "attn":
        return (0.0, 6.0 * h) if cfg.learned_pos else (22.25 * h, 40.25 * h)
    if kind == "mlp":
        return (5.0 * f, 21.0 * f + 3.0 * h) if cfg.mlp == "swiglu" else (2.0 * f, 3.0 * f)
    return 0.0, 0.0


RESIDUAL_ELEMENTS = 6
"""Elements per token per unit of hidden the block's two residual adds move in forward."""


# [Note: operators per layer in analytic profiles]
# The host's time is priced per dispatched operator ([Note: host time per op] in
# plan/schedule.py), so an analytic layer carries the count a trace of the same module gets
# (`LayerProfile.forward_ops`; tests/profile/test_analytic.py checks them against it): a norm 2
# (layer norm, or RMSNorm where `_fused_rmsnorm`) or 7 (the composite RMSNorm), attention 19
# (qkv and output projections, SDPA, the layout views), GELU MLP 10, SwiGLU 15, a block's
# residual adds and views 3, the embedding 1 (4 with learned positions), the head its norm
# plus 12 (its projection and cross-entropy). A spec without learned positions stands for a
# rotary model (Llama), whose attention (HF's LlamaAttention with its rotary embedding,
# traced) dispatches 24 operators more.
ROTARY_OPS = 24


def _forward_ops(cfg: GPTConfig, kind: str, fused_rms: bool) -> int:
    """`LayerProfile.forward_ops` of a top-level layer ([Note: operators per layer in analytic profiles])."""
    norm = 2 if cfg.norm != "rmsnorm" or fused_rms else 7
    if kind == "embed":
        return 4 if cfg.learned_pos else 1
    if kind == "head":
        return norm + 12
    attn = 19 + (0 if cfg.learned_pos else ROTARY_OPS)
    return 2 * norm + attn + (15 if cfg.mlp == "swiglu" else 10) + 3


def _block(ctx: _Ctx, prefix: str, shapes: dict[str, Shapes]) -> LayerProfile:
    """2 * params * tokens per child (norms included, negligible) + causal attention's 2*b*s^2*h,
    and the memory-bound ops' bytes at the device's bandwidth ([Note: memory-bound work in
    analytic blocks])."""
    cfg, T, d = ctx.cfg, ctx.tokens, ctx.d
    attention_flops = causal_attention_flops(b=ctx.b, s=ctx.s, h=cfg.hidden)
    acts = {"ln1": _norm_act(cfg, T, d, ctx.fused_rms), "attn": _attn_act(cfg, b=ctx.b, s=ctx.s, d=d),
            "ln2": _norm_act(cfg, T, d, ctx.fused_rms), "mlp": _mlp_act(cfg, T, d)}
    children = []
    for child, child_shapes in shapes.items():
        p = _count(child_shapes)
        attention = attention_flops if child.endswith(".attn") else 0
        kind = child.rsplit(".", 1)[1]
        # Every child reads one (T, h) tensor of the residual stream (checkpointing keeps it).
        moved_f, moved_b = (T * d * e / ctx.bandwidth for e in _moved_elements(cfg, kind, ctx.fused_rms))
        fwd = ctx.seconds(2 * p * T, attention) + moved_f
        bwd = ctx.seconds(2 * 2 * p * T, ATTENTION_BACKWARD * attention) + moved_b
        children.append(_leaf(child, params=p, fwd_seconds=fwd, bwd_seconds=bwd, act=acts[kind],
                              largest=_largest_saved(cfg, kind, T, d, ctx.fused_rms), inp=T * cfg.hidden * d,
                              saved=_selective_saved(cfg, kind, b=ctx.b, s=ctx.s, d=d),
                              recompute=(ctx.seconds(_selective_recomputed_flops(cfg, kind, T)) + moved_f, moved_f)
                              if kind in ("attn", "mlp") else None))
    params, act = sum(c.params for c in children), sum(c.activation_bytes for c in children)
    residual = RESIDUAL_ELEMENTS * T * cfg.hidden * d / ctx.bandwidth
    return _parent(prefix, children, inp=T * cfg.hidden * d, d=d, extra_fwd=residual, extra_bwd=0.0,
                   backward_peak=_block_backward_peak(cfg, T, d, grads=params * d, act=act))


def _block_backward_peak(cfg: GPTConfig, tokens: int, d: int, *, grads: int, act: int) -> int:
    """Bytes above the block's activations at its backward's peak, gradients included.
    Activation-heavy blocks peak in the MLP's first ops (it runs first), all the
    block's activations still live: the incoming (T, h) gradient, the down
    projection's weight (and bias) gradient and the gradient of its (T, ffn) input,
    and for SwiGLU the first of the two (T, ffn) gradients of the gated product.
    Parameter-heavy ones peak late, in the attention's input projection: every weight
    gradient, every activation freed, and seven (T, h) gradients (a count read off
    the trace, not derived op by op: the gradients of q, k, v, of the input, and of
    the residual stream; the trace's full backward hooks had kept an eighth alive,
    which FSDPMemTracker does not see: gelu 2x128 full_shard now -0.00%, was +0.77%).
    Equal to the traced peak
    (`profile.workspace`) in both regimes for gelu/layernorm, and for swiglu/rmsnorm
    when activations dominate (tests/profile/test_trace.py); a parameter-heavy SwiGLU
    block peaks inside its MLP, higher than either (up to ~9 (T, h) tensors at 16
    tokens of hidden 256), which this misses."""
    h, f = cfg.hidden, cfg.ffn_size
    inner = 2 if cfg.mlp == "swiglu" else 1
    first_ops = d * (tokens * h + inner * tokens * f + h * f + (h if cfg.bias else 0))
    return max(first_ops, grads - act + 7 * tokens * h * d)


def _selective_saved(cfg: GPTConfig, kind: str, *, b: int, s: int, d: int) -> tuple[int, int]:
    """What selective checkpointing keeps of a block child (`core.sac_policy`), (`+sac`, `+sac-all`).
    `+sac-all`: the outputs of its matmuls and of attention. Attention: the qkv output (T, 3h),
    SDPA's output (T, h) and fp32 logsumexp, the out-projection's output (T, h); MLP: its inner
    (T, ffn) outputs (two for SwiGLU's gate and up) and the down-projection's (T, h). Its
    recomputation is then its memory-bound ops alone, which these profiles do not price in
    forward either (norms are priced as their FLOPs: they are recomputed). `+sac` (torchtitan's
    every-second-mm rule, the block's counter): the block's mms are qkv (1st, kept), the out
    projection (2nd, recomputed), then gate (3rd, kept), up (4th, recomputed), down (5th,
    kept), or fc (3rd, kept), proj (4th, recomputed). Biased linears run as addmm, which the
    counter skips: all kept, as under `+sac-all`."""
    tokens, h = b * s, cfg.hidden
    if kind == "attn":
        every = 5 * tokens * h * d + 4 * b * cfg.heads * s
        return (every if cfg.bias else every - tokens * h * d), every
    if kind == "mlp":
        every = (2 if cfg.mlp == "swiglu" else 1) * tokens * cfg.ffn_size * d + tokens * h * d
        second = tokens * cfg.ffn_size * d if cfg.mlp == "swiglu" else tokens * h * d
        return (every if cfg.bias else every - second), every
    return 0, 0


def _selective_recomputed_flops(cfg: GPTConfig, kind: str, tokens: int) -> float:
    """Forward matmul FLOPs `+sac` recomputes in a block child (`_selective_saved`): the out
    projection, SwiGLU's up or GELU's second projection; none with biases."""
    if cfg.bias:
        return 0.0
    h, f = cfg.hidden, cfg.ffn_size
    return 2.0 * tokens * (h * h if kind == "attn" else h * f)


def _largest_saved(cfg: GPTConfig, kind: str, tokens: int, d: int, fused_rms: bool) -> int:
    """Largest single tensor a block child saves: qkv output (T, 3h), MLP inner
    (T, ffn), or a norm's input (fp32 copies in the composite RMSNorm)."""
    if kind == "attn":
        return 3 * tokens * cfg.hidden * d
    if kind == "mlp":
        return tokens * cfg.ffn_size * d
    return tokens * cfg.hidden * (max(d, 4) if cfg.norm == "rmsnorm" and not fused_rms else d)


def _embed(ctx: _Ctx, shapes: dict[str, Shapes]) -> LayerProfile:
    """Memory bound: gather T rows of h (write T*h*d). Backward also zeroes and
    scatter-adds into the full fp32 weight gradient. Saved: only the int64
    position indices (token indices are the example input, counted in input_bytes)."""
    T, h, d = ctx.tokens, ctx.cfg.hidden, ctx.d
    children = []
    for child, child_shapes in shapes.items():
        p = _count(child_shapes)
        fwd = 2 * T * h * d / ctx.bandwidth
        act = 8 * ctx.s if child == "embed.pos" else 0
        children.append(LayerProfile(name=child, params=p, forward_seconds=fwd,  # no matmul: all recomputed
                                     backward_seconds=fwd + 2 * 4 * p / ctx.bandwidth, activation_bytes=act,
                                     selective_saved_bytes=0, selective_recompute_seconds=fwd,
                                     selective_all=(0, 0, 0, fwd)))
    # At its end, its backward holds the incoming (T, h) gradient besides its weight
    # gradients, its (position index) activations freed.
    grads, act = sum(c.params for c in children) * d, sum(c.activation_bytes for c in children)
    return _parent("embed", children, d=d, backward_peak=T * h * d + grads - act)


def _head(ctx: _Ctx, shapes: dict[str, Shapes]) -> LayerProfile:
    """Norm, then 2*h*vocab FLOPs per token; cross-entropy outside the children
    saves log_softmax's fp32 (T, vocab) output (logits are upcast before it)."""
    cfg, T, d = ctx.cfg, ctx.tokens, ctx.d
    ln_p, out_p = _count(shapes["head.ln"]), _count(shapes["head.out"])
    x = T * cfg.hidden * d  # the (T, h) input: what a checkpointed head keeps (targets are example input)
    ln = _leaf("head.ln", params=ln_p, fwd_seconds=ctx.seconds(2 * ln_p * T), act=_norm_act(cfg, T, d, ctx.fused_rms),
               inp=x)
    logits = T * cfg.vocab * d
    # Cross-entropy runs in the head's own code after its projection, so the trace folds it into
    # `head.out` as that child's outside code ([Note: the parent's own code in a partition] in
    # plan/units.py): it saves log_softmax's fp32 (T, vocab) output (logits are upcast before it)
    # and nll_loss's 0-d fp32 total_weight (+ 4); its backward holds the gradients of the fp32
    # log-probs and of the upcast logits, two (T, vocab) fp32 tensors. head.out's own backward
    # holds the logits' gradient it receives and its input's gradient beside the weight's.
    ce = 4 * T * cfg.vocab + 4
    out = dataclasses.replace(
        _leaf("head.out", params=out_p, fwd_seconds=ctx.seconds(2 * cfg.hidden * cfg.vocab * T), act=x + ce, inp=x,
              saved=(logits, logits), recompute=(0.0, 0.0), workspace=logits + 2 * x, out=logits),
        outside_bytes=ce, outside_workspace_bytes=2 * 4 * T * cfg.vocab)
    ce_seconds = 3 * T * cfg.vocab * 4 / ctx.bandwidth  # read logits, write fp32 copy and log-probs
    # (targets are example input, `input_bytes`). The whole head's backward peaks in
    # cross-entropy (a head whose weight gradient outweighs it peaks a little higher, in its
    # norm's backward).
    return _parent("head", [ln, out], extra_fwd=ce_seconds, inp=x, d=d, backward_peak=2 * 4 * T * cfg.vocab)


# ---------------------------------------------------------------- entry point

def analytic_profile(config: GPTConfig, *, micro_batch: int, seq: int, device: DeviceSpec,
                     compute_dtype: str = "bfloat16", name: str = "") -> Profile:
    """Per-layer Profile of `GPT(config)` for (micro_batch, seq) inputs on `device`, without building it."""
    if compute_dtype not in DTYPE_BYTES:
        raise UsageError(f"unknown compute dtype {compute_dtype!r}: accepted {', '.join(DTYPE_BYTES)}")
    if micro_batch < 1 or seq < 1:
        raise UsageError(f"micro_batch ({micro_batch}) and seq ({seq}) must be positive")
    if config.learned_pos and seq > config.seq:
        raise UsageError(f"seq={seq} exceeds the model's position table ({config.seq})")
    ctx = _Ctx(cfg=config, b=micro_batch, s=seq, d=DTYPE_BYTES[compute_dtype], device=device,
               bandwidth=_MEMORY_BANDWIDTH.get(device.name, device.flops / 100), fused_rms=_fused_rmsnorm(device))
    children = _layer_children_shapes(config)
    # Every block is the same: build one and rename it (keeps gpt3-175b at ~ms).
    block0 = _block(ctx, "blocks.0", children["blocks.0"]) if config.layers else None
    blocks = [_renamed(block0, "blocks.0", f"blocks.{i}") for i in range(config.layers)]
    layers = tuple(_with_dims(layer, children[layer.name if not layer.name.startswith("blocks.") else "blocks.0"])
                   for layer in (_embed(ctx, children["embed"]), *blocks, _head(ctx, children["head"])))
    layers = tuple(dataclasses.replace(layer, forward_ops=_forward_ops(
        config, layer.name if layer.name in ("embed", "head") else "block", ctx.fused_rms)) for layer in layers)
    return Profile(model=name or "gpt", layers=layers, fingerprint=fingerprint_of_shapes(gpt_param_shapes(config)),
                   compute_dtype=compute_dtype, micro_batch=micro_batch, seq=seq,
                   input_bytes=2 * 8 * micro_batch * seq, source="analytic",
                   extra={"device": device.name, "config": config_dict(config)})


def _dims(shapes: Shapes) -> tuple[tuple[int, int], ...]:
    return tuple((shape[0], _count([(n, shape)])) for n, shape in shapes)


def _with_dims(layer: LayerProfile, children: dict[str, Shapes]) -> LayerProfile:
    """Per-parameter (dim 0, numel), for FSDP2's dim-0 padding (blocks share block 0's shapes)."""
    kids = tuple(dataclasses.replace(c, dims=_dims(shapes)) for c, shapes in zip(layer.children, children.values()))
    return dataclasses.replace(layer, dims=tuple(d for c in kids for d in c.dims), children=kids)


def _renamed(layer: LayerProfile, old: str, new: str) -> LayerProfile:
    if old == new:
        return layer
    kids = tuple(dataclasses.replace(c, name=new + c.name[len(old):]) for c in layer.children)
    return dataclasses.replace(layer, name=new, children=kids)
