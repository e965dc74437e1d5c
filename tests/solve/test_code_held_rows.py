"""The outputs the calling code holds ([Note: outputs the caller's code holds] in
profile/held.py) in the MILP's memory rows and greedy's evaluator equal the simulator's.

Same check as `test_milp_vs_brute.test_memory_rows_and_evaluator_match_simulator`, on a traced
U-Net (the generator's: `x = dec(torch.cat([up(x), skip], 1))` holds the last encoder's output
through the decoder's forward), every grouping the planner offers, each unit none, full or
selective at random.
"""
import random

import pytest
import torch

from shardsched.core.types import Checkpoint
from shardsched.profile.trace import trace_profile
from shardsched.cost.device import DEVICES
from shardsched.sim.memory import step_memory
from shardsched.solve import milp
from shardsched.solve.candidates import candidate_problems
from shardsched.solve.greedy import Evaluator

from ..plan._generated import Spec, build
from .test_milp_vs_brute import CLUSTER, KW, check_rows_and_evaluator, random_choice


@pytest.fixture(scope="module")
def unet():
    torch.set_num_threads(1)
    model, inputs = build(Spec(family="cnn", depth=5, width=8, vocab=10, seq=16, batch=2, norm="batch",
                               skip=True, seed=1))
    return trace_profile(model, inputs, name="unet", device=DEVICES["cpu"])


def _modes(ch, r: random.Random):
    if not ch.ckpt:
        return ch
    return ch._replace(ckpt=tuple(Checkpoint.SELECTIVE if c and r.random() < 0.5 else c for c in ch.ckpt))


def test_the_trace_sees_the_held_output(unet):
    # each decoder's input is made from `x`, the layer before's output, which `x` still holds
    # through the decoder's forward (a ReLU saved it: kept only while that layer does not recompute)
    layers = {layer.name: layer for layer in unet.layers}
    before = {"dec.0": "enc.2", "dec.1": "dec.0"}
    for name, layer in layers.items():
        prev = before.get(name)
        out = layers[prev].output_bytes if prev else 0
        assert layer.code_held == ({prev: (out, out, out)} if prev else {}), name
        assert layer.code_held_bytes == 0


def test_rows_and_evaluator_match_simulator_with_held_outputs(unet):
    r = random.Random(5)
    seen = 0
    for p in candidate_problems(unet, CLUSTER, **KW):
        b, ev = milp._Build(p, budget=1 << 40, ahead=p.n, t_ub=None), Evaluator(p)
        for _ in range(12):
            ch = _modes(random_choice(p, r), r)
            check_rows_and_evaluator(p, b, ev, ch)
            sc = p.scenario(ch)
            seen += any(sc.code_held_bytes(i) for i in range(p.n)) or any(
                b.held for u in sc.units for b in u.layer_bytes)
    assert seen  # the term was there in some choices
    # and it is live beside the decoder's forward exactly when the encoder recomputes
    p = next(p for p in candidate_problems(unet, CLUSTER, **KW) if p.n == len(unet.layers))
    ch = random_choice(p, r)
    names = [u.layers for u in p.costs]
    dec, enc = names.index(("dec.0",)), names.index(("enc.2",))
    out = {layer.name: layer for layer in unet.layers}["enc.2"].output_bytes
    for mode, held in ((False, 0), (True, out), (Checkpoint.SELECTIVE, out)):
        sc = p.scenario(ch._replace(ckpt=tuple(mode if j == enc else False for j in range(p.n)) if mode else ()))
        assert sc.code_held_bytes(dec) == held
