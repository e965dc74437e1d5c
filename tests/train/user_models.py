"""Models given to `--model python:<this file>:<function>` in the train tests: the
contract of `shardsched.train.task` (builders returning (model, example_inputs[, batch_fn]))
and builders that break it in each way `validate` must catch."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardsched.train.task import text_batch_fn

BATCH, SEQ, SEED = 8, 16, 3


def gpt2_config():
    from transformers import GPT2Config
    # Byte vocabulary, no dropout (parity needs deterministic steps), tied embeddings.
    return GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                      bos_token_id=0, eos_token_id=0)


def _byte_gpt2_class():
    from transformers import GPT2LMHeadModel

    class ByteGPT2(GPT2LMHeadModel):
        """HF GPT-2 whose forward is the `text_lm` contract: (idx, targets) -> mean cross-entropy.
        A subclass, so module paths stay HF's (`transformer.wte`, `lm_head`, ...)."""

        def forward(self, idx, targets):
            logits = super().forward(input_ids=idx).logits
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return ByteGPT2


def gpt2_tied():
    """A small random-init transformers GPT-2 (lm_head tied to transformer.wte) that
    trains on the byte-level text corpus through a batch function."""
    model = _byte_gpt2_class()(gpt2_config())
    assert model.lm_head.weight is model.transformer.wte.weight
    batch_fn = text_batch_fn(batch=BATCH, seq=SEQ, seed=SEED)
    x, y = batch_fn(0, 0, 2)
    return model, (x, y), batch_fn


class Regression(nn.Module):
    """A two-layer MLP whose forward is the loss (mean squared error)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(8, width)
        self.fc2 = nn.Linear(width, 1)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(torch.tanh(self.fc1(x))).squeeze(-1), y)


def _regression_batch(step: int, rank: int, world: int) -> tuple:
    """Global batch `step` of 8 rows, a function of the step only; rank r takes its rows."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 8, generator=g)
    y = x.sum(dim=1).sin()
    rows = BATCH // world
    return x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]


def mlp_repeat():
    """No batch function: every step trains on the example inputs again."""
    return Regression(), _regression_batch(0, 0, 2)


def mlp_batches():
    return Regression(), _regression_batch(0, 0, 2), _regression_batch


class LogitsAndLoss(Regression):
    """nanoGPT's contract: forward returns (prediction, loss) ([Note: a forward that returns more
    than the loss] in models/spec.py)."""

    def forward(self, x, y):
        pred = self.fc2(torch.tanh(self.fc1(x))).squeeze(-1)
        return pred, F.mse_loss(pred, y)


def logits_and_loss():
    return LogitsAndLoss(), _regression_batch(0, 0, 2), _regression_batch


# ---------------------------------------------------------------- broken builders

def raises():
    raise RuntimeError("config file missing")


def wrong_shape():
    return (Regression(),)


def not_a_module():
    return "model", (torch.zeros(1),)


def vector_loss():
    class PerRow(Regression):
        def forward(self, x, y):
            return (self.fc2(self.fc1(x)).squeeze(-1) - y) ** 2
    return PerRow(), _regression_batch(0, 0, 2)


def two_losses():
    class Two(Regression):
        def forward(self, x, y):
            pred = self.fc2(self.fc1(x)).squeeze(-1)
            return F.mse_loss(pred, y), F.l1_loss(pred, y)  # which one trains? not ours to guess
    return Two(), _regression_batch(0, 0, 2)


def bad_batch_fn():
    return Regression(), _regression_batch(0, 0, 2), "not callable"


def failing_batch_fn():
    def batch_fn(step, rank, world):
        raise KeyError("no shard for this rank")
    return Regression(), _regression_batch(0, 0, 2), batch_fn



# ---------------------------------------------------------------- BatchNorm

class ConvBlock(nn.Module):
    """conv-BN-ReLU-conv-BN with a residual: running statistics in a checkpointable layer."""

    def __init__(self, width: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class BatchNormCNN(nn.Module):
    def __init__(self, width: int = 8, classes: int = 5, stem: nn.Module | None = None, block=ConvBlock):
        super().__init__()
        self.stem = stem or nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList([block(width), block(width)])
        self.head = nn.Linear(width, classes)

    def forward(self, x, y):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h.mean((2, 3))), y)


def _image_batch(step: int, rank: int, world: int) -> tuple:
    """The whole global batch on every rank: BatchNorm's batch statistics then equal one
    process's, so losses and running statistics can be compared exactly. Two batches in
    turn: the model learns them within a short run."""
    g = torch.Generator().manual_seed(2000 + step % 2)
    x = torch.randn(BATCH, 3, 8, 8, generator=g)
    return x, x.mean((2, 3)).argmax(1)  # learnable: the brightest channel


def bn_cnn():
    return BatchNormCNN(), _image_batch(0, 0, 1), _image_batch


# ---------------------------------------------------------------- a graph: no batch dimension

NODES, EDGES, FEATURES = 50, 120, 8


class GraphConv(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, h, edges):
        agg = torch.zeros_like(h).index_add(0, edges[1], h[edges[0]])
        return torch.relu(self.lin(h + agg))


class GNN(nn.Module):
    """Node classification on one graph: x (nodes, features), edges (2, edges), y (nodes,)."""

    def __init__(self, classes: int = 3):
        super().__init__()
        self.convs = nn.ModuleList([GraphConv(FEATURES), GraphConv(FEATURES)])
        self.head = nn.Linear(FEATURES, classes)

    def forward(self, x, edges, y):
        for conv in self.convs:
            x = conv(x, edges)
        return F.cross_entropy(self.head(x), y)


def gnn():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(NODES, FEATURES, generator=g)
    edges = torch.randint(0, NODES, (2, EDGES), generator=g)
    return GNN(), (x, edges, x[:, :3].argmax(1))


# ---------------------------------------------------------------- models the libraries warn about

class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block as transformers writes it: depthwise conv, LayerNorm and an MLP over
    channels-last, the residual added there and permuted back. Its output is a view (FSDP2
    warns), and the next block's conv sees channels-last activations, so its depthwise weight's
    gradient has another stride on its size-1 dimension than DDP's bucket (DDP warns)."""

    def __init__(self, width: int):
        super().__init__()
        self.dw = nn.Conv2d(width, width, 7, padding=3, groups=width)
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        h = self.dw(x).permute(0, 2, 3, 1)
        return (x.permute(0, 2, 3, 1) + self.fc2(F.gelu(self.fc1(self.norm(h))))).permute(0, 3, 1, 2)


class ConvNeXt(BatchNormCNN):
    """Two ConvNeXt blocks after a patchify stem."""

    def __init__(self, width: int = 8):
        super().__init__(width, stem=nn.Conv2d(3, width, 2, stride=2), block=ConvNeXtBlock)


def _channels_last_batch(step: int, rank: int, world: int) -> tuple:
    """Images in channels-last memory, as vision code feeds convolutions on GPUs."""
    x, y = _image_batch(step, rank, world)
    return x.contiguous(memory_format=torch.channels_last), y


def convnext():
    return ConvNeXt(), _channels_last_batch(0, 0, 1), _channels_last_batch


class LSTMModel(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(32, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, 32)

    def forward(self, idx, targets):
        out, _ = self.lstm(self.embed(idx))
        return F.cross_entropy(self.head(out).flatten(0, 1), targets.flatten())


def lstm():
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 32, (4, 12), generator=g)
    return LSTMModel(), (idx, idx.roll(1, 1))



class Seq2Seq(nn.Module):
    """nn.Transformer, encoder and decoder, on token ids: the issue's third model whose units
    return views (FSDP2's warning)."""

    def __init__(self, width: int = 16, vocab: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.core = nn.Transformer(width, 2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
                                   dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, src, tgt):
        out = self.core(self.embed(src), self.embed(tgt[:, :-1]))
        return nn.functional.cross_entropy(self.head(out).flatten(0, 1), tgt[:, 1:].flatten())


def seq2seq():
    g = torch.Generator().manual_seed(5)
    return Seq2Seq(), (torch.randint(0, 32, (4, 10), generator=g), torch.randint(0, 32, (4, 9), generator=g))
