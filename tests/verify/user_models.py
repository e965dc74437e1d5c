"""Models written by hand, as users write them, with the structures issue 26 found missed or
refused: a scalar parameter (CLIP's logit_scale), an unused parameter (DINOv2's mask_token),
one layer object at two places, a boolean-mask loss and scatter message passing (a GNN),
a fused RNN (nn.LSTM, nn.GRU), nn.TransformerEncoderLayer, frozen parameters, parameters read
outside their module (an output projection tied by hand).

Each `build_*` is a `python:` builder: it returns (model, example_inputs) with
`model(*example_inputs)` the scalar loss, and takes the keyword arguments it declares."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Clip(nn.Module):
    """Two towers and a learned temperature: a 0-dim parameter FSDP2 cannot shard."""

    def __init__(self, d: int = 64, depth: int = 2):
        super().__init__()
        self.image = nn.Sequential(*[nn.Sequential(nn.Linear(d, d), nn.GELU()) for _ in range(depth)])
        self.text = nn.Sequential(*[nn.Sequential(nn.Linear(d, d), nn.GELU()) for _ in range(depth)])
        self.logit_scale = nn.Parameter(torch.tensor(2.659))

    def forward(self, img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
        a, b = F.normalize(self.image(img), dim=-1), F.normalize(self.text(txt), dim=-1)
        logits = self.logit_scale.exp() * a @ b.t()
        labels = torch.arange(a.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def build_clip(micro_batch: int = 16, d: int = 64):
    g = _gen()
    return Clip(d), (torch.randn(micro_batch, d, generator=g), torch.randn(micro_batch, d, generator=g))


class Dino(nn.Module):
    """A ViT-like encoder holding a `mask_token` that the training loss never uses."""

    def __init__(self, d: int = 64, depth: int = 2, patches: int = 16):
        super().__init__()
        self.embed = nn.Linear(48, d)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, patches, d))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, 4, 2 * d, batch_first=True, dropout=0.0)
                                    for _ in range(depth))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos
        for b in self.blocks:
            h = b(h)
        return F.cross_entropy(self.head(h.mean(1)), y)


def build_dino(micro_batch: int = 4):
    g = _gen()
    return Dino(), (torch.randn(micro_batch, 16, 48, generator=g), torch.randint(0, 10, (micro_batch,), generator=g))


class SharedLayers(nn.Module):
    """One decoder-layer object registered at two positions: layers = [L0, L1, L0, L1]."""

    def __init__(self, d: int = 64, vocab: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        l0, l1 = (nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(2))
        self.layers = nn.ModuleList([l0, l1, l0, l1])
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for layer in self.layers:
            h = h + layer(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


def build_shared(micro_batch: int = 4, seq: int = 32):
    g = _gen()
    return SharedLayers(), (torch.randint(0, 256, (micro_batch, seq), generator=g),
                            torch.randint(0, 256, (micro_batch, seq), generator=g))


class MessagePassing(nn.Module):
    """One GNN layer: messages gathered along edges and scattered back with index_add_."""

    def __init__(self, d: int):
        super().__init__()
        self.msg, self.upd = nn.Linear(d, d), nn.Linear(2 * d, d)

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        agg = torch.zeros_like(h).index_add_(0, dst, F.relu(self.msg(h[src])))
        return F.relu(self.upd(torch.cat([h, agg], -1)))


class Gnn(nn.Module):
    """Node classification whose loss reads a boolean node mask (`logits[mask]`)."""

    def __init__(self, d_in: int = 32, d: int = 64, depth: int = 3, classes: int = 7):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.layers = nn.ModuleList(MessagePassing(d) for _ in range(depth))
        self.out = nn.Linear(d, classes)

    def forward(self, x, src, dst, y, mask):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h, src, dst)
        return F.cross_entropy(self.out(h)[mask], y[mask])


def build_gnn(nodes: int = 400, edges: int = 2000):
    g = _gen()
    mask = torch.rand(nodes, generator=g) < 0.5
    return Gnn(), (torch.randn(nodes, 32, generator=g), torch.randint(0, nodes, (edges,), generator=g),
                   torch.randint(0, nodes, (edges,), generator=g), torch.randint(0, 7, (nodes,), generator=g), mask)


class RnnLM(nn.Module):
    """A tied LSTM (or GRU) language model: a fused RNN kernel between two tied tables."""

    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 2, cell: str = "lstm"):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(d, d, num_layers=layers, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(idx))
        return F.cross_entropy(self.head(self.norm(h)).flatten(0, 1), targets.flatten())


def build_lstm(micro_batch: int = 4, seq: int = 64, cell: str = "lstm"):
    g = _gen()
    return RnnLM(cell=cell), (torch.randint(0, 512, (micro_batch, seq), generator=g),
                              torch.randint(0, 512, (micro_batch, seq), generator=g))


def build_gru(micro_batch: int = 4, seq: int = 64):
    return build_lstm(micro_batch, seq, cell="gru")


class EncoderViT(nn.Module):
    """A ViT from nn.TransformerEncoderLayer(batch_first=True, norm_first=True), with frozen
    sinusoidal-like positions (requires_grad=False, as Pegasus' position tables)."""

    def __init__(self, d: int = 96, depth: int = 3, patches: int = 64, classes: int = 10):
        super().__init__()
        self.patch = nn.Linear(48, d)
        self.pos = nn.Parameter(torch.randn(1, patches, d), requires_grad=False)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(depth))
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.patch(x) + self.pos
        for b in self.blocks:
            h = b(h)
        return F.cross_entropy(self.head(h.mean(1)), y)


def build_vit(micro_batch: int = 8):
    g = _gen()
    return EncoderViT(), (torch.randn(micro_batch, 64, 48, generator=g), torch.randint(0, 10, (micro_batch,), generator=g))


class FrozenBackbone(nn.Module):
    """A frozen pretrained trunk (an embedding table and a projection, `requires_grad=False`)
    under a small trained head: the trunk gets no gradient and no optimizer state."""

    def __init__(self, vocab: int = 2000, d: int = 64, classes: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.proj = nn.Linear(d, d)
        for p in [*self.embed.parameters(), *self.proj.parameters()]:
            p.requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, classes))

    def forward(self, idx: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.proj(self.embed(idx)).mean(1)), y)


def build_frozen(micro_batch: int = 8, seq: int = 16):
    g = _gen()
    return FrozenBackbone(), (torch.randint(0, 2000, (micro_batch, seq), generator=g),
                              torch.randint(0, 10, (micro_batch,), generator=g))


class Tower(nn.Module):
    """An input projection (a Linear, or an nn.Embedding of tokens) and nn.TransformerEncoderLayers."""

    def __init__(self, d: int, depth: int, *, features: int = 0, vocab: int = 0):
        super().__init__()
        self.inp = nn.Linear(features, d) if features else nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True, norm_first=True,
                                                               dropout=0.0) for _ in range(depth))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.norm(h)


class TwoTower(nn.Module):
    """An image tower, then a text tower that starts with its token embedding: a unit whose
    inputs need no gradient in the middle of forward ([Note: a unit whose inputs need no
    gradient] in runtime/own_backward.py)."""

    def __init__(self, d: int = 96, vocab: int = 3000):
        super().__init__()
        self.image, self.text = Tower(d, 2, features=48), Tower(d, 2, vocab=vocab)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, patches: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        a = F.normalize(self.proj(self.image(patches).mean(1)), dim=-1)
        b = F.normalize(self.text(tokens)[:, 0], dim=-1)
        logits = 10.0 * a @ b.t()
        labels = torch.arange(a.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def build_two_tower(micro_batch: int = 4, seq: int = 24):
    g = _gen(1)
    return TwoTower(), (torch.randn(micro_batch, 16, 48, generator=g),
                        torch.randint(0, 3000, (micro_batch, seq), generator=g))


class Recurrence(nn.Module):
    """A gated linear recurrence over time whose own code reads its output layer's weight
    (a block reading a child's parameter outside the child)."""

    def __init__(self, d: int):
        super().__init__()
        self.norm, self.inp, self.out = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.decay = nn.Parameter(torch.tensor(0.9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, gate = self.inp(self.norm(x)).chunk(2, -1)
        h, hs = torch.zeros_like(u[:, 0]), []
        for t in range(u.shape[1]):
            h = self.decay.sigmoid() * h + u[:, t]
            hs.append(h)
        return x + self.out(torch.stack(hs, 1) * F.silu(gate)) * self.out.weight.diagonal()


class HandTied(nn.Module):
    """An LM whose output projection is its token embedding read in the model's own forward
    (`h @ self.emb.weight.t()`), not a second registration of one tensor: under FSDP2 the
    embedding's weight is a sharded DTensor there ([Note: a parameter used outside its layer] in
    profile/escapes.py)."""

    def __init__(self, vocab: int = 3000, d: int = 96, depth: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Recurrence(d) for _ in range(depth))
        self.norm = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        for layer in self.layers:
            h = layer(h)
        return F.cross_entropy((self.norm(h) @ self.emb.weight.t()).flatten(0, 1), tgt.flatten())


def build_hand_tied(micro_batch: int = 4, seq: int = 24):
    x = torch.randint(0, 3000, (micro_batch, seq + 1), generator=_gen(2))
    return HandTied(), (x[:, :-1].contiguous(), x[:, 1:].contiguous())


class EngineBreaker(nn.Module):
    """Stands for code the engine breaks on that no profile can see (it looks at the type of a
    layer's parameter outside the layer, which no op does): one step fails under FSDP2."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if type(self.a.weight).__name__ == "DTensor":
            raise RuntimeError("this code needs a plain tensor")
        return F.mse_loss(self.b(self.a(x)), y)


def build_engine_breaker(micro_batch: int = 4):
    g = _gen(3)
    return EngineBreaker(), (torch.randn(micro_batch, 16, generator=g), torch.randn(micro_batch, 16, generator=g))


def _conv(i: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(4, o), nn.SiLU())


class UNet(nn.Module):
    """A small U-Net with an MSE loss, whose scalar keeps a buffer the size of the output
    ([Note: a loss reduced in its own buffer] in profile/fake_rules.py)."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.down1, self.down2 = _conv(3, c), _conv(c, 2 * c)
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.fuse, self.out = _conv(2 * c, c), nn.Conv2d(c, 3, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        a = self.down1(x)
        y = self.fuse(torch.cat([self.up(self.down2(self.pool(a))), a], 1))
        return F.mse_loss(self.out(y), target)


def build_unet_mse(micro_batch: int = 4, size: int = 32):
    x = torch.randn(micro_batch, 3, size, size, generator=_gen(4))
    return UNet(), (x, x.flip(-1).contiguous())


class SelfCheckpointed(nn.Module):
    """A pre-norm attention-and-MLP block that checkpoints its own MLP (`torch.utils.checkpoint`
    in its forward, as user code and HF's gradient checkpointing do): [Note: a checkpoint inside
    the model] in profile/trace_fake.py."""

    def __init__(self, d: int = 64, reentrant: bool = False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).unflatten(-1, (3, 4, -1)).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))
        return x + torch.utils.checkpoint.checkpoint(self.mlp, self.ln2(x), use_reentrant=self.reentrant)


class BlocksLM(nn.Module):
    """An embedding, a stack of blocks and a head, trained on next-token cross-entropy."""

    def __init__(self, blocks: list[nn.Module], vocab: int, d: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


class SelfCheckpointedLM(BlocksLM):
    def __init__(self, vocab: int = 128, d: int = 64, depth: int = 3, reentrant: bool = False):
        super().__init__([SelfCheckpointed(d, reentrant) for _ in range(depth)], vocab, d)


def build_self_ckpt(micro_batch: int = 4, seq: int = 32, reentrant: bool = False):
    idx = torch.randint(0, 128, (micro_batch, seq + 1), generator=_gen(5))
    return SelfCheckpointedLM(reentrant=reentrant), (idx[:, :-1].contiguous(), idx[:, 1:].contiguous())


class TopTwoMoE(nn.Module):
    """A top-2 mixture of experts as Mixtral's eager code runs it: each expert takes the tokens
    routed to it (`torch.where` on a mask the router computes: data-dependent) and scatters its
    output back with `index_add_`."""

    def __init__(self, d: int, experts: int = 4, in_place: bool = False):
        super().__init__()
        self.in_place = in_place  # renormalise the top-2 weights in place, as Mixtral's router does
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                     for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = x.reshape(-1, d)
        weights, chosen = torch.topk(self.router(h).softmax(-1), 2, dim=-1)  # (tokens, 2)
        if self.in_place:
            weights /= weights.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            y = expert(h[rows]) * weights[rows, slot, None]
            out = out.index_add(0, rows, y)
        return x + out.reshape(b, t, d)


class MoEBlock(nn.Module):
    def __init__(self, d: int, in_place: bool = False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.moe = TopTwoMoE(d, in_place=in_place)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return self.moe(self.ln2(x))


class MoELM(BlocksLM):
    def __init__(self, vocab: int = 256, d: int = 64, depth: int = 3, in_place: bool = False):
        super().__init__([MoEBlock(d, in_place) for _ in range(depth)], vocab, d)


def build_moe(micro_batch: int = 4, seq: int = 32, in_place: bool = False):
    torch.manual_seed(0)
    idx = torch.randint(0, 256, (micro_batch, seq + 1), generator=_gen(6))
    return MoELM(in_place=in_place), (idx[:, :-1].contiguous(), idx[:, 1:].contiguous())


class ScoreGated(nn.Module):
    """Tokens whose learned score is positive go through the MLP. `masked=True`: only those
    tokens are computed (`h[keep]`, `out[keep] = ...`: data-dependent); else every token, gated."""

    def __init__(self, d: int, masked: bool):
        super().__init__()
        self.masked = masked
        self.norm, self.score = nn.LayerNorm(d), nn.Linear(d, 1)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        keep = self.score(h).squeeze(-1) > 0  # the score's branch dies here: it saved h for nothing
        if not self.masked:
            return x + self.mlp(h) * keep.unsqueeze(-1)
        out = x.clone()
        out[keep] = out[keep] + self.mlp(h[keep])  # h itself is saved by nothing else
        return out


class ScoreGatedLM(BlocksLM):
    def __init__(self, masked: bool, vocab: int = 300, d: int = 48, depth: int = 4):
        super().__init__([ScoreGated(d, masked) for _ in range(depth)], vocab, d)
        self.masked = masked

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = super().forward(idx, targets)
        if self.masked:
            loss = loss * int((targets >= 0).sum().item()) / targets.numel()  # a value read on the host
        return loss


def build_score_gated(micro_batch: int = 4, seq: int = 40, masked: bool = True):
    torch.manual_seed(1)
    idx = torch.randint(0, 300, (micro_batch, seq + 1), generator=_gen(7))
    return ScoreGatedLM(masked), (idx[:, :-1].contiguous(), idx[:, 1:].contiguous())


class _PackedGRU(nn.Module):
    """A bidirectional GRU over a padded batch packed by its lengths (`PackedSequence`, a
    namedtuple whose constructor checks its fields): [Note: inputs walked, not rebuilt]."""

    def __init__(self, vocab: int = 200, d: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.rnn = nn.GRU(d, d, num_layers=2, batch_first=True, bidirectional=True)
        self.cls = nn.Linear(2 * d, 5)

    def forward(self, ids, lengths, y):
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(ids), lengths, batch_first=True, enforce_sorted=False)
        _, h = self.rnn(packed)
        return F.cross_entropy(self.cls(torch.cat([h[-2], h[-1]], -1)), y)


def build_packed_gru(micro_batch: int = 8, seq: int = 30):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    lengths = torch.linspace(seq, 3, micro_batch).round().long()
    return _PackedGRU(), (torch.randint(1, 200, (micro_batch, seq), generator=g), lengths,
                          torch.randint(0, 5, (micro_batch,), generator=g))


class _OutsideMixer(nn.Module):
    """An MLP-Mixer whose blocks are `ModuleDict`s the caller's code runs: every residual add and
    GELU is code outside every layer. The last residual sum is held in a local, saved by
    nothing, through the head's forward ([Note: results of outside code the caller holds]), and
    each GELU saves a Linear layer's output that `+sac` also keeps (`trace._shared_output`)."""

    def __init__(self, tokens: int = 16, d: int = 48, depth: int = 4):
        super().__init__()
        self.patch = nn.Linear(48, d)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(n1=nn.LayerNorm(d), tok=nn.Linear(tokens, tokens),
                                                       n2=nn.LayerNorm(d), ch=nn.Linear(d, d))) for _ in range(depth))
        self.head = nn.Linear(d, 10)

    def forward(self, x, y):
        h = self.patch(x)
        for b in self.blocks:
            h = h + b["tok"](b["n1"](h).transpose(1, 2)).transpose(1, 2)
            h = h + F.gelu(b["ch"](b["n2"](h)))
        return F.cross_entropy(self.head(h.mean(1)), y)


def build_outside_mixer(micro_batch: int = 8):
    torch.manual_seed(0)
    return _OutsideMixer(), (torch.randn(micro_batch, 16, 48), torch.randint(0, 10, (micro_batch,)))


SPARE_D = 64


class _SpareBlock(nn.Module):
    def __init__(self, spare: bool):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(SPARE_D, 4 * SPARE_D), nn.GELU(), nn.Linear(4 * SPARE_D, SPARE_D))
        self.spare = nn.Linear(SPARE_D, 2 * SPARE_D) if spare else None  # never called
        self.layerdrop = 0.0

    def forward(self, x):
        return x + self.mlp(x)


class Spare(nn.Module):
    """Six blocks (a stack traced with its first three), each with a Linear its forward never
    calls; an unused root parameter; an unused head beside the one the loss reads."""

    def __init__(self, spare: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList([_SpareBlock(spare) for _ in range(6)])
        self.token = nn.Parameter(torch.zeros(SPARE_D))  # DINOv2's mask_token, with no mask
        self.head = nn.Linear(SPARE_D, 10)
        self.aux = nn.Linear(SPARE_D, 1000) if spare else None

    def forward(self, x, y):
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(x), y)


def build_spare(spare: bool = True):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    return Spare(spare), (torch.randn(32, SPARE_D, generator=g), torch.randint(0, 10, (32,), generator=g))
