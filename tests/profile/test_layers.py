"""Layer discovery does not depend on how a block is written, and `--layers` / the `python:`
contract's `shardsched_layers` name layers (profile/layers.py, [Note: an inline chain is a
layer's body], [Note: naming layers])."""
import json
from pathlib import Path

import pytest
import torch

from shardsched.cli import main
from shardsched.cost.device import DEVICES, Cluster
from shardsched.errors import UsageError
from shardsched.profile import layers as L
from shardsched.profile.trace import trace_profile
from shardsched.solve.build import make_plan

import layer_models as lm  # tests/profile is on sys.path (pytest rootdir import mode)

MODELS = Path(__file__).with_name("layer_models.py")
BLOCKS = ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]


def _plan_json(capsys, *args) -> dict:
    assert main(["plan", "--json", "--no-fuse", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_sequential_mlp_and_custom_mlp_plan_the_same():
    """The same maths as nn.Sequential or a custom module: the same layers and the same
    least-memory (full_shard+ckpt, one unit per layer) peak. Before, the Sequential form was
    split into its Linears and planned at 3.39 MB against 1.83 MB."""
    cluster = Cluster(world=8, gpus_per_node=8, device=DEVICES["cpu"])
    peaks = {}
    for build in (lm.sequential_mlp, lm.custom_mlp):
        model, inputs = build()
        profile = trace_profile(model, inputs, name=build.__name__, device=DEVICES["cpu"])
        assert [layer.name for layer in profile.layers] == BLOCKS
        peaks[build.__name__] = make_plan(profile, cluster, strategy="full_shard+ckpt", fuse=False).predicted.peak_bytes
    assert peaks["sequential_mlp"] == peaks["custom_mlp"] < 2_000_000


def test_a_lone_wrapper_is_looked_through():
    model, _ = lm.wrapped_chain()
    assert L.discover(model) == ["net.features.0", "net.features.1", "net.features.3", "net.head"]


def test_resolve_spec_class_path_glob():
    model, _ = lm.custom_mlp()
    assert L.resolve_spec(model, "Block") == L.resolve_spec(model, "blocks.*") == \
        ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "embed", "head"]
    # A class inside the blocks: the blocks around it are split into their other children.
    assert L.resolve_spec(model, "MLP,head") == [
        "blocks.0.mlp", "blocks.1.mlp", "blocks.2.mlp", "blocks.3.mlp", "head", "embed",
        "blocks.0.norm", "blocks.1.norm", "blocks.2.norm", "blocks.3.norm"]
    assert L.resolve_spec(model, ["blocks.0", "blocks.0.mlp.fc1"]) == ["blocks.0", "embed", "blocks.1", "blocks.2",
                                                                      "blocks.3", "head"]  # outermost wins
    for bad in ("Nope", "blocks.9", "a,,b", ["blocks.0", 3]):
        with pytest.raises(UsageError):
            L.resolve_spec(model, bad)


def test_layers_flag_and_attribute(capsys):
    plan = _plan_json(capsys, "--model", f"python:{MODELS}:sequential_mlp", "--layers", "Linear", "--strategy",
                      "full_shard")
    assert [u["name"] for u in plan["units"]] == ["embed", *(f"blocks.{i}.{c}" for i in range(4)
                                                             for c in ("norm", "mlp.0", "mlp.2")), "head"]
    plan = _plan_json(capsys, "--model", f"python:{MODELS}:named_by_attribute", "--strategy", "full_shard")
    assert [u["name"] for u in plan["units"]] == ["embed", *(f"blocks.{i}.{c}" for i in range(4)
                                                             for c in ("norm", "mlp")), "head"]


@pytest.mark.parametrize("layers, message", [("Nope", "'Nope' names no module"), (" , ", "empty item")])
def test_bad_layers_is_one_line_exit_2(capsys, layers, message):
    assert main(["plan", "--model", f"python:{MODELS}:custom_mlp", "--layers", layers]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_train_plans_with_layers_and_refuses_bad_ones(tmp_path, capsys):
    """`train --layers`: the run's plan (made on rank 0, `train.planning.make_local_plan`) uses
    the named layers; a name that matches nothing stops the run before any worker starts."""
    from shardsched.train.config import TrainConfig
    from shardsched.train.planning import make_local_plan
    from shardsched.train.task import build
    cfg = TrainConfig(model=f"python:{MODELS}:custom_mlp", layers="MLP,embed,head", strategy="full_shard",
                      run_dir=str(tmp_path / "run"))
    plan = make_local_plan(cfg, build(cfg, world=2), world=2)
    assert [layer for u in plan.units for layer in u.layers] == [
        "embed", *(f"blocks.{i}.{c}" for i in range(4) for c in ("norm", "mlp")), "head"]
    assert main(["train", "--model", f"python:{MODELS}:custom_mlp", "--layers", "Nope", "--nproc", "2",
                 "--steps", "2", "--run-dir", str(tmp_path / "bad")]) == 2
    assert "'Nope' names no module" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "plan.json").exists()
