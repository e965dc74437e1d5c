"""`train` for a model that is not the built-in GPT (`--model python:...`, `train.task`):
a transformers GPT-2 with tied embeddings under a mixed plan matches one process;
a model without a batch function repeats its inputs and says so; bad builders are
one line, exit 2, before any worker starts."""
from pathlib import Path

import pytest
import torch

from shardsched.cli import main
from shardsched.train.launcher import launch

from ._helpers import make_plan_by_hand, plan_worker, reference_run, tiny_config
from .user_models import BATCH, SEED, SEQ

MODELS = Path(__file__).with_name("user_models.py")


def spec(function: str) -> str:
    return f"python:{MODELS}:{function}"


def test_tied_hf_gpt2_mixed_plan_matches_single_process(tmp_path):
    cfg = tiny_config(str(tmp_path / "run"), model=spec("gpt2_tied"), batch=BATCH, seq=SEQ, seed=SEED)
    threads = torch.get_num_threads()
    try:
        want = reference_run(cfg)[0]
    finally:
        torch.set_num_threads(threads)
    # The tied pair (lm_head.weight is transformer.wte.weight) must be one unit: FSDP2
    # refuses a parameter managed by two groups. wpe and ln_f stay in the root.
    plan = make_plan_by_hand(cfg, world=2, units=[
        ("tied", ("transformer.wte", "lm_head"), "full_shard", ("transformer.h.0",), ()),
        ("transformer.h.0", ("transformer.h.0",), "replicate", (), ()),
        ("transformer.h.1", ("transformer.h.1",), "shard_grad_op", (), ("transformer.h.0",)),
    ])
    out = tmp_path / "losses.pt"
    launch(plan_worker, nproc=2, args=(cfg, plan, str(out)))
    got, summary = torch.load(out, weights_only=False)
    assert len(got) == 20
    assert want[-1] < want[0] - 0.5  # it learns, so agreeing means something
    assert got == pytest.approx(want, rel=1e-5)
    assert [u["strategy"] for u in summary["units"]] == ["full_shard", "replicate", "shard_grad_op"]
    assert summary["tokens_per_s"] > 0  # BATCH rows of the batch function per step


def test_model_without_batch_fn_repeats_inputs_and_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["train", "--model", spec("mlp_repeat"), "--nproc", "2", "--steps", "8", "--lr", "0.01",
               "--run-dir", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0, err
    lines = [ln for ln in err.splitlines() if "no batch function" in ln]
    assert len(lines) == 1 and "every step trains on its example inputs again" in lines[0]
    import json
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows]
    assert len(losses) == 8 and losses[-1] < losses[0]  # the same batch again: the loss falls
    summary = json.loads((run / "summary.json").read_text())
    assert any("no batch function" in n for n in summary["notes"])


def test_a_forward_returning_predictions_and_loss_trains_on_its_loss(tmp_path):
    """nanoGPT returns (logits, loss): the loss is the one 0-dim tensor; 2 workers' losses are
    the mean squared errors of the two halves of each global batch, step 1 before any update."""
    import json

    from .user_models import LogitsAndLoss, _regression_batch
    run = tmp_path / "run"
    assert main(["train", "--model", spec("logits_and_loss"), "--nproc", "2", "--steps", "3", "--lr", "0.01",
                 "--strategy", "full_shard", "--run-dir", str(run), "--quiet"]) == 0
    torch.manual_seed(0)  # the trainer's seed: the same initial weights
    model = LogitsAndLoss()
    halves = [model(*_regression_batch(0, r, 2))[1].item() for r in (0, 1)]
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and first["loss"] == pytest.approx(sum(halves) / 2, rel=1e-5)


@pytest.mark.parametrize("function, fragment", [
    ("raises", "the builder raised RuntimeError: config file missing"),
    ("wrong_shape", "must return (model, example_inputs) or (model, example_inputs, batch_fn), got a 1-item"),
    ("not_a_module", "must return (model, example_inputs)"),
    ("vector_loss", "must return the scalar loss, got a tensor of shape (4,)"),
    ("two_losses", "must return the scalar loss, got tuple"),
    ("bad_batch_fn", "the third value must be batch_fn(step, rank, world), got str"),
    ("failing_batch_fn", "batch_fn(0, 0, 2) raised KeyError"),
])
def test_bad_builders_are_one_line_exit_2(function, fragment, tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["train", "--model", spec(function), "--nproc", "2", "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and fragment in err, err
    assert "Traceback" not in err and not run.exists()


def test_byte_text_needs_a_vocabulary_of_256(capsys):
    assert main(["train", "--model", "gpt:layers=1,hidden=16,heads=2,vocab=100", "--nproc", "1"]) == 2
    assert "vocab 100 < 256" in capsys.readouterr().err


def test_checkpoint_and_resume_on_another_worker_count(tmp_path, capsys):
    """A user model with a batch function: saved by 2 workers at step 3, resumed by 1,
    the same losses as the uninterrupted run."""
    import json
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--steps", "6", "--lr", "0.01", "--strategy", "full_shard", "--quiet"]
    assert main(["train", "--model", spec("mlp_batches"), "--nproc", "2", "--checkpoint-every", "3",
                 "--run-dir", str(first), *common]) == 0
    # --model again: a run directory never makes shardsched import code (issue 9).
    assert main(["train", "--resume", str(first / "checkpoints" / "step_000003"), "--nproc", "1",
                 "--model", spec("mlp_batches"), "--strategy", "full_shard", "--run-dir", str(second),
                 "--quiet"]) == 0
    capsys.readouterr()

    def losses(run):
        return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    whole, resumed = losses(first), losses(second)
    assert sorted(whole) == [1, 2, 3, 4, 5, 6] and sorted(resumed) == [4, 5, 6]
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(whole[step], rel=1e-5), step
    summary = json.loads((second / "summary.json").read_text())
    assert summary["start_step"] == 3 and summary["world"] == 1 and summary["model"] == spec("mlp_batches")


@pytest.mark.parametrize("flags, fragment", [(["--seq", "64"], "--seq 64: python:"),
                                             (["--batch", "16", "--seq", "8"], "--batch 16 --seq 8: python:")])
def test_shape_flags_for_a_user_model_are_refused_not_ignored(flags, fragment, tmp_path, capsys):
    rc = main(["train", "--model", spec("mlp_batches"), "--nproc", "2", *flags, "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and fragment in err and "would change nothing" in err, err
    assert not (tmp_path / "r").exists()  # refused before anything is written


def _train(run, model: str, *extra: str) -> dict:
    import json
    rc = main(["train", "--model", spec(model), "--nproc", "2", "--steps", "2", "--run-dir", str(run), *extra])
    assert rc == 0
    return json.loads((run / "summary.json").read_text())


def test_graph_inputs_are_stated_as_built_and_the_table_shows_checkpointing(tmp_path, capfd):
    """A graph's inputs share no batch dimension: no "micro-batch 50" (its node count), no
    --batch/--seq defaults in summary.json; the units table says +ckpt as the plan does."""
    run = tmp_path / "run"
    summary = _train(run, "gnn", "--strategy", "full_shard+ckpt")
    out = capfd.readouterr().out  # rich writes to the file descriptor
    words = "inputs as built (50x8 float32, 2x120 int64, 50 int64)"
    assert (summary["batch"], summary["seq"], summary["micro_batch"], summary["inputs"]) == (None, None, None, words)
    assert summary["input_shapes"] == [{"shape": [50, 8], "dtype": "float32"}, {"shape": [2, 120], "dtype": "int64"},
                                       {"shape": [50], "dtype": "int64"}]
    first = (run / "train.log").read_text().splitlines()[0]
    assert words in first and "micro-batch" not in first, first
    assert {u["checkpoint"] for u in summary["units"]} == {"+ckpt"}
    # throughput counts each worker's input set, not 50 "rows" of node features
    assert summary["throughput_unit"] == "batches"
    assert summary["tokens_per_s"] == pytest.approx(2 / summary["measured_step_seconds"], rel=1e-9)
    assert "batches/s" in out and "rows/s" not in out
    table = out[out.index("units"):]
    assert "full_shard+ckpt" in table and " full_shard " not in table, table


def test_batched_user_inputs_state_their_micro_batch(tmp_path):
    summary = _train(tmp_path / "run", "mlp_batches")
    assert (summary["batch"], summary["seq"], summary["micro_batch"], summary["inputs"]) == (None, None, 4, None)
    assert summary["input_shapes"] == [{"shape": [4, 8], "dtype": "float32"}, {"shape": [4], "dtype": "float32"}]


@pytest.mark.parametrize("model, strategy, words", [
    ("convnext", "replicate", "note: DDP warns that a gradient's memory layout differs from its reduction bucket's"),
    ("convnext", "full_shard", "note: FSDP2 warns that the unit of Conv2d, ConvNeXtBlock, Linear returns a view"),
    ("lstm", "full_shard", "note: FSDP2 warns that the unit of Embedding, LSTM, Linear returns a view"),
    ("seq2seq", "full_shard", "note: FSDP2 warns that the unit of Embedding, TransformerEncoderLayer, LayerNorm, "
                              "TransformerDecoderLayer, Linear returns a view"),
])
def test_library_warnings_are_said_once_in_our_words(model, strategy, words, tmp_path, capfd):
    """PyTorch warned from every worker (2-8 lines a run); now rank 0 says once what it means."""
    summary = _train(tmp_path / "run", model, "--strategy", strategy, "--steps", "3", "--quiet")
    err = capfd.readouterr().err
    assert [ln for ln in err.splitlines() if "warn" in ln.lower()] == [ln for ln in err.splitlines()
                                                                         if ln.startswith(words)], err
    assert len([ln for ln in err.splitlines() if ln.startswith(words)]) == 1, err
    assert "UserWarning" not in err and "bucket view strides" not in err and "view tensor" not in err
    assert [n for n in summary["notes"] if n.startswith(words.removeprefix("note: "))] != []
