"""Every `hf:` family the presets name trains on its own objective with
`shardsched train --model hf:X --nproc 2 --steps 5` (tiny configs, real workers)."""
import json
import math
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

TEXT = "vocab_size=512"
VISION = "num_labels=10,image_size=32"
# (spec, what the first loss should be near: ln(vocabulary) or ln(classes) for a fresh model)
FAMILIES = {
    "gpt2": (f"hf:gpt2,n_layer=2,n_embd=64,n_head=2,{TEXT}", math.log(512)),
    "llama": (f"hf:llama,num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=2,"
              f"num_key_value_heads=2,{TEXT}", math.log(512)),
    "bert": (f"hf:bert-base-uncased,num_hidden_layers=2,hidden_size=64,intermediate_size=128,"
             f"num_attention_heads=2,{TEXT}", math.log(511)),  # masked: the last id is the mask
    "t5": (f"hf:t5-small,num_layers=2,d_model=64,d_ff=128,num_heads=2,d_kv=32,{TEXT}", math.log(512)),
    "vit": (f"hf:google/vit-base-patch16-224,num_hidden_layers=2,hidden_size=64,num_attention_heads=2,"
            f"intermediate_size=128,patch_size=8,{VISION}", math.log(10)),
    "resnet": (f"hf:microsoft/resnet-50,hidden_sizes=[16,32,64,128],embedding_size=8,depths=[1,1,1,1],{VISION}",
               math.log(10)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hf_family_trains(family, tmp_path):
    spec, expected_first = FAMILIES[family]
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "shardsched", "train", "--model", spec, "--nproc", "2",
                           "--steps", "5", "--batch", "4", "--seq", "32", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    losses = [r["loss"] for r in rows]
    assert all(math.isfinite(x) for x in losses)
    # The model's own objective on fresh weights: near-uniform predictions over the vocabulary / classes.
    assert abs(losses[0] - expected_first) < 0.8, (losses[0], expected_first)
    vision = family in ("vit", "resnet")
    data = json.loads((run_dir / "config.json").read_text())["data_used"]
    assert data["source"].startswith("synthetic images: 10 classes") if vision else "source" in data
    assert (" img/s" if vision else " tok/s") in proc.stdout
