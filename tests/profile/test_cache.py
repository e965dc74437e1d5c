"""A second `plan` of the same python: model reuses its traced profile and verification
(`profile.cache`, [Note: the profile cache]): the same plan, no fake tensors made."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from shardsched.profile.cache import model_key

ROOT = Path(__file__).resolve().parents[2]
MODEL = f"python:{ROOT / 'tests' / 'train' / 'user_models.py'}:gnn"


def _plan(cache: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SHARDSCHED_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, *flags, "-m", "shardsched", "plan", "--model", MODEL, "--world", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return r


def _timeless(path: Path) -> dict:
    plan = json.loads(path.read_text())
    plan["solver"]["seconds"] = 0.0  # the solver's wall time, the one field a run changes
    return plan


def _entries(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*.json")}


def _timeless_text(out: str) -> str:
    """The plan table without the solver's wall time ("..., 0.004 s" on a loaded machine)."""
    return re.sub(r"\d+\.\d+ s\n$", "s\n", out)


def test_second_plan_reuses_the_trace_and_verification(tmp_path):
    cache = tmp_path / "cache"
    first = _plan(cache, tmp_path / "a.json")
    entries = _entries(cache)
    assert sorted({k.split("/")[0] for k in entries}) == ["traced", "verified"]
    second = _plan(cache, tmp_path / "b.json", "-X", "importtime")
    # with both entries read, no FakeTensorMode is made: torch._dynamo (which it imports) never loads
    assert "torch._dynamo" not in second.stderr and "torch._dynamo" in _plan(
        tmp_path / "fresh", tmp_path / "c.json", "-X", "importtime").stderr
    assert _entries(cache) == entries  # read, not written again
    assert _timeless_text(second.stdout) == _timeless_text(first.stdout)
    assert _timeless(tmp_path / "b.json") == _timeless(tmp_path / "a.json")


def test_the_cached_profile_is_what_plans_read_and_a_corrupt_one_is_ignored(tmp_path):
    cache = tmp_path / "cache"
    first = _plan(cache, tmp_path / "a.json")
    (traced,) = (cache / "traced").iterdir()
    profile = json.loads(traced.read_text())
    traced.write_text(json.dumps({**profile, "model": "read-from-the-cache"}))
    assert "plan for read-from-the-cache" in _plan(cache, tmp_path / "b.json").stdout
    traced.write_text("{not json")
    assert _timeless_text(_plan(cache, tmp_path / "c.json").stdout) == _timeless_text(first.stdout)
    assert json.loads(traced.read_text()) == profile  # written again


def test_cache_off_writes_nothing(tmp_path):
    _plan(Path("off"), tmp_path / "a.json")
    assert not Path("off").exists() and [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_the_key_sees_an_edited_forward_and_other_input_shapes():
    class A(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).sum()

    class B(A):  # the same parameters, another forward
        def forward(self, x):
            return self.fc(x).relu().sum()
    x = torch.randn(2, 4)
    assert model_key(A(), (x,)) == model_key(A(), (torch.randn(2, 4),))  # values are not seen
    assert model_key(A(), (x,)) != model_key(B(), (x,))
    assert model_key(A(), (x,)) != model_key(A(), (torch.randn(3, 4),))


def test_the_key_sees_a_plain_attribute_the_forward_reads():
    """HF's `gradient_checkpointing` (and `training`) are attributes `repr` hides: a GPT-2 traced
    with checkpointing on was handed to the same model with it off, its plan 26% under."""
    from tests.train.user_models import gpt2_tied
    model, inputs, _ = gpt2_tied()
    plain = model_key(model, inputs)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model_key(model, inputs) != plain
    model, inputs, _ = gpt2_tied()
    assert model_key(model, inputs) == plain
    model.eval()
    assert model_key(model, inputs) != plain


def test_a_preset_plans_verification_is_cached_too(tmp_path, monkeypatch):
    """A preset (an analytic profile; its model built on the meta device to verify) is keyed as
    built: the second verification of the same plan runs nothing, another plan runs again."""
    import dataclasses

    from shardsched.models.spec import parse_model_spec
    from shardsched.profile.resolve import build_model
    from shardsched.solve.build import make_plan
    from shardsched.core.types import Precision
    from shardsched.cost.device import DEVICES, Cluster
    from shardsched.profile.analytic import analytic_profile
    from shardsched.verify import engine
    from shardsched.verify.subject import Subject, verifier
    monkeypatch.setenv("SHARDSCHED_CACHE", str(tmp_path / "cache"))
    spec = parse_model_spec("tiny")
    profile = analytic_profile(spec.config, micro_batch=2, seq=spec.config.seq, device=DEVICES["cpu"])
    plan = make_plan(profile, Cluster(world=4, gpus_per_node=4, device=DEVICES["cpu"]), strategy="full_shard",
                     precision=Precision.FP32, optimizer="adam")
    runs = []
    real_verify = engine.verify_plan
    monkeypatch.setattr(engine, "verify_plan", lambda *a, **k: runs.append(1) or real_verify(*a, **k))

    def build(*, micro_batch, seq, real):
        return build_model(spec, micro_batch=micro_batch, seq=seq, measure=real)
    first = verifier(Subject(None, (), build))(plan)
    again = verifier(Subject(None, (), build))(dataclasses.replace(plan, notes=("another budget",)))
    assert len(runs) == 1 and again == first
    verifier(Subject(None, (), build))(dataclasses.replace(plan, micro_batch=1))
    assert len(runs) == 2
