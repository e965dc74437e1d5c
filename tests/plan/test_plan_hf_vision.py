"""hf: image classifiers plan (ViT, ResNet with list-valued overrides); a model that fails
when run for real under --measure is one line, exit 2; a bad list override is one line."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

RESNET = "hf:microsoft/resnet-50,hidden_sizes=[16,32,64,128],embedding_size=8,depths=[1,1,1,1],image_size=32"


def plan(*args):
    return subprocess.run([sys.executable, "-m", "shardsched", "plan", "--world", "2", "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=300)


def test_resnet_plans_with_list_overrides():
    r = plan("--model", RESNET, "--micro-batch", "2", "--strategy", "full_shard", "--no-fuse", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    layers = [name for u in p["units"] for name in u["layers"]]
    # depths [1,1,1,1]: one bottleneck block per stage, each a layer of its own (or split into its children)
    for stage in range(4):
        assert any(n.startswith(f"resnet.encoder.stages.{stage}.layers.0") for n in layers), layers
    assert p["micro_batch"] == 2 and p["seq"] == 0
    assert p["model"] == RESNET


def test_measure_failure_is_one_line():
    # micro-batch 1 and 32-pixel images leave BatchNorm one value per channel at the last stage
    r = plan("--model", RESNET, "--micro-batch", "1", "--measure")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1
    assert "--measure: running hf:microsoft/resnet-50" in r.stderr and "Expected more than 1 value" in r.stderr


def test_measure_runs_resnet():
    r = plan("--model", RESNET, "--micro-batch", "2", "--measure", "--strategy", "full_shard", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["predicted"]["step_seconds"] > 0


@pytest.mark.parametrize("spec, fragment", [
    ("hf:resnet,hidden_sizes=[16,x", "hf: resnet config refuses these values"),
    ("hf:resnet,depths=[1,1]x,hidden_sizes=[8,8]", "hf: resnet config refuses these values"),
])
def test_bad_list_override_is_one_line(spec, fragment):
    r = plan("--model", spec)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and fragment in r.stderr, r.stderr
