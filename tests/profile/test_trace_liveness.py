"""What the trace sees live beyond each layer's own saved tensors, in closed form: gradients
held across a window ([Note: gradients held beside a window]), a layer's output that code
outside it saves again ([Note: what outside code saves again]) and a layer's own input that an
earlier layer saved (`LayerProfile.input_saved_bytes`)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardsched.cost.device import DEVICES
from shardsched.plan.kept import kept_when_checkpointed, recomputed_bytes
from shardsched.profile.trace import trace_profile

CPU = DEVICES["cpu"]
F32 = 4


class Skip(nn.Module):
    """l3(cat(l2(h1) * 3, h1)): the gradient w.r.t. the concatenation, (B, 2C), waits through
    l2's backward for its h1 half (unless the skip is detached)."""

    def __init__(self, c: int, detach: bool):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(2 * c, c)
        self.detach = detach

    def forward(self, x):
        h1 = self.l1(x)
        skip = h1.detach() if self.detach else h1
        return self.l3(torch.cat([self.l2(h1 * 2.0) * 3.0, skip], -1)).square().mean()


def _profile(model, *inputs):
    torch.manual_seed(0)
    return {layer.name: layer for layer in trace_profile(model, inputs, name="m", device=CPU).layers}


def test_a_skip_gradient_held_through_a_window_is_in_its_workspace():
    torch.set_num_threads(1)
    b, c = 8, 16
    x = torch.randn(b, c)
    held, detached = _profile(Skip(c, False), x), _profile(Skip(c, True), x)
    # the (B, 2C) gradient of the concatenation, live through l2's window, and nowhere else
    assert held["l2"].workspace_bytes - detached["l2"].workspace_bytes == b * 2 * c * F32
    assert held["l2"].bucketed_workspace_bytes - detached["l2"].bucketed_workspace_bytes == b * 2 * c * F32
    assert held["l3"].workspace_bytes == detached["l3"].workspace_bytes
    assert held["l1"].workspace_bytes == detached["l1"].workspace_bytes


class ConvReLU(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        return F.relu(self.conv(x))


class LinearReLU(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return F.relu(self.fc(x))


class NormLinear(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return self.fc(self.norm(x))


class Pooled(nn.Module):
    """conv -> relu (a layer), max-pooled by the root's code, then a linear head: the pooling
    saves the ReLU's output again (and its int64 indices)."""

    def __init__(self, c: int, side: int):
        super().__init__()
        self.block = ConvReLU(3, c)
        self.head = nn.Linear(c * (side // 2) ** 2, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.head(F.max_pool2d(self.block(x), 2).flatten(1)), y)


def test_an_output_the_root_saves_again_is_kept_when_its_layer_recomputes():
    torch.set_num_threads(1)
    b, c, side = 2, 8, 16
    layers = _profile(Pooled(c, side), torch.randn(b, 3, side, side), torch.randint(0, 10, (b,)))
    block = layers["block"]
    relu_out = b * c * side * side * F32
    assert block.outside_kept_bytes == relu_out
    assert block.outside_bytes == b * c * (side // 2) ** 2 * 8  # the pooling's indices (int64)
    assert kept_when_checkpointed(block) == block.input_bytes + block.outside_bytes + relu_out
    assert layers["head"].outside_kept_bytes == 0


class Chain(nn.Module):
    """a = Linear -> ReLU; b = Linear (saves its input, the ReLU's output a saved first);
    c = LayerNorm -> Linear on b's output plus a's (a sum no op saves: c's own norm saves it)."""

    def __init__(self, d: int):
        super().__init__()
        self.a, self.b, self.c = LinearReLU(d), nn.Linear(d, d), NormLinear(d)

    def forward(self, x):
        h = self.a(x)
        return self.c(self.b(h) + h).square().mean()


def test_a_recomputed_layer_keeps_the_input_an_earlier_layer_saved():
    torch.set_num_threads(1)
    n, d = 4, 32
    layers = _profile(Chain(d), torch.randn(n, d))
    b, c = layers["b"], layers["c"]
    assert (b.input_bytes, b.input_saved_bytes, b.input_saved_before_bytes) == (n * d * F32, 0, n * d * F32)
    assert (c.input_bytes, c.input_saved_bytes, c.input_saved_before_bytes) == (n * d * F32, n * d * F32, 0)
    # recomputing b holds its kept input (saved by a's ReLU in the plain trace) beside what it saves
    assert recomputed_bytes(b) == b.activation_bytes + n * d * F32
    assert recomputed_bytes(c) == c.activation_bytes


class Stem(nn.Module):
    """Linear -> LayerNorm (layers of an `nn.Sequential`), a ReLU after them (code outside every
    layer), then a Linear: its input was saved first by that ReLU, not by a layer."""

    def __init__(self, d: int):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d), nn.ReLU(), nn.Linear(d, d))

    def forward(self, x):
        return self.seq(x).square().mean()


def test_an_input_outside_code_saved_is_not_kept_again_when_recomputing():
    torch.set_num_threads(1)
    n, d = 4, 32
    last = _profile(Stem(d), torch.randn(n, d))["seq.3"]
    assert (last.input_bytes, last.input_saved_before_bytes, last.input_saved_outside_bytes) == \
        (n * d * F32, 0, n * d * F32)
    assert recomputed_bytes(last) == last.activation_bytes
    # the ReLU keeps it whatever recomputes: not among the inputs a recomputed layer keeps
    assert kept_when_checkpointed(last) == last.outside_bytes + last.outside_kept_bytes

