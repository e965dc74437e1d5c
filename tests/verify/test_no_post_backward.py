"""Fused units with modules FSDP2 runs no post-backward for, each predicted as FSDP2 on fake
tensors measures it (`verify_plan`). FSDP2 hooks a module's post-backward (reshard, reduce) on
its forward inputs that need a gradient; an embedding fed indices or a Linear fed the batch has
none, so inside a fused unit its gradients wait for the next module's reduce and the unit stays
gathered ([Note: modules with no post-backward] in sim/unit_cost.py). Before:
- a DLRM (a dense MLP, four EmbeddingBag tables, a pairwise interaction, a top MLP: one unit)
  under shard_grad_op: -12.8% (its tables' gradients, reduced with the MLP's second Linear,
  are held as its first Linear gathers again); full_shard was exact;
- a Linear fed the batch, then an embedding, then a head: +33.8% under shard_grad_op (a gather
  and reduce between the two that never happen), +6.5% under full_shard; the same, its last
  reduce the peak: -5.5% (the output allocated beside the input and the table's gradient);
- a VAE whose MSE loss saves the decoder's output, under shard_grad_op+sac: -3.0% (the output
  the policy keeps was taken off the loss's transient, though the loss saves it).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardsched.cost.device import DEVICES
from shardsched.profile.trace import trace_profile

from ._predicted import traced_predicted_and_verified


def _gen() -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(0)
    return g


class Dlrm(nn.Module):
    def __init__(self, tables=(1000, 2000, 500, 800), d=32, dense=13):
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, d), nn.ReLU())
        self.emb = nn.ModuleList(nn.EmbeddingBag(n, d, mode="sum") for n in tables)
        f = len(tables) + 1
        self.top = nn.Sequential(nn.Linear(d + f * (f - 1) // 2, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense, idx, offsets, y):
        x = self.bot(dense)
        t = torch.stack([x] + [e(idx[i], offsets[i]) for i, e in enumerate(self.emb)], 1)  # (B, F, d)
        z = torch.bmm(t, t.transpose(1, 2))  # (B, F, F)
        li, lj = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)
        return F.binary_cross_entropy_with_logits(self.top(torch.cat([x, z[:, li, lj]], 1)).squeeze(1), y)


def _dlrm(batch=64, bag=3):
    g, model = _gen(), Dlrm()
    idx = torch.stack([torch.randint(0, e.num_embeddings, (batch * bag,), generator=g) for e in model.emb])
    offsets = torch.arange(0, batch * bag, bag).repeat(len(model.emb), 1)
    return model, (torch.randn(batch, 13, generator=g), idx, offsets, torch.rand(batch, generator=g).round())


class DenseThenTable(nn.Module):
    def __init__(self, rows=4000, d=32):
        super().__init__()
        self.bot, self.emb, self.top = nn.Linear(13, d), nn.Embedding(rows, d), nn.Linear(d, 1)

    def forward(self, dense, idx, y):
        x = self.bot(dense) + self.emb(idx.view(-1, 3)).sum(1)
        return F.binary_cross_entropy_with_logits(self.top(x).squeeze(1), y)


def _dense_then_table(batch=64):
    g = _gen()
    return DenseThenTable(), (torch.randn(batch, 13, generator=g), torch.randint(0, 4000, (batch * 3,), generator=g),
                              torch.rand(batch, generator=g).round())


class Vae(nn.Module):
    def __init__(self, c=32, z=16):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, c, 4, 2, 1), nn.SiLU(), nn.Conv2d(c, 2 * c, 4, 2, 1), nn.SiLU(),
                                 nn.Flatten(), nn.Linear(2 * c * 64, 2 * z))
        self.dec_in = nn.Linear(z, 2 * c * 64)
        self.dec = nn.Sequential(nn.ConvTranspose2d(2 * c, c, 4, 2, 1), nn.SiLU(), nn.ConvTranspose2d(c, 3, 4, 2, 1))
        self.c = c

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        rec = self.dec(self.dec_in(z).view(x.shape[0], 2 * self.c, 8, 8))
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1).mean()
        return F.mse_loss(rec, x) + 1e-3 * kl


def _vae(batch=16):
    return Vae(), (torch.randn(batch, 3, 32, 32, generator=_gen()),)


CASES = [(_dlrm, "shard_grad_op"), (_dlrm, "full_shard"), (_dlrm, "shard_grad_op+sac"), (_dlrm, "full_shard+ckpt"),
         (_dense_then_table, "shard_grad_op"), (_dense_then_table, "full_shard"), (_vae, "shard_grad_op+sac"),
         (_vae, "shard_grad_op")]


@pytest.mark.parametrize("build,strategy", CASES, ids=[f"{b.__name__[1:]}-{s}" for b, s in CASES])
def test_fused_units_with_modules_that_run_no_post_backward(build, strategy):
    predicted, verified = traced_predicted_and_verified(build, strategy, fuse=True)
    assert abs(predicted / verified - 1) <= 0.01, (predicted, verified)


def test_the_trace_marks_the_modules_fed_no_gradient():
    model, inputs = _dlrm()
    profile = trace_profile(model, inputs, name="dlrm", device=DEVICES["cpu"])
    fed = {layer.name: layer.input_needs_grad for layer in profile.layers}
    assert fed == {"bot.0": False, "bot.2": True, "emb.0": False, "emb.1": False, "emb.2": False, "emb.3": False,
                   "top.0": True, "top.2": True}
