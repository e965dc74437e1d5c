"""Table folding helpers: runs of repeated unit patterns and their span names."""
import random

from shardsched._fmt import periodic_runs, short_name, span_name


def test_periodic_runs_cover_every_item_once_with_true_repetitions():
    rng = random.Random(0)
    for _ in range(300):
        items = "".join(rng.choice("ab" if rng.random() < 0.5 else "abc") for _ in range(rng.randint(0, 14)))
        groups = periodic_runs(items, key=lambda c: c)
        covered = [i for a, p, r in groups for i in range(a, a + p * r)]
        assert covered == list(range(len(items)))
        for a, p, r in groups:
            assert p == 1 or r == 1 or r >= 3  # period 1: maximal runs of any length
            assert all(items[a + k * p:a + (k + 1) * p] == items[a:a + p] for k in range(r))


def test_alternating_blocks_fold_with_period_two():
    assert periodic_runs("e" + "am" * 32 + "h", key=lambda c: c) == [(0, 1, 1), (1, 2, 32), (65, 1, 1)]


def test_span_and_short_names():
    assert span_name("blocks.0", "blocks.95") == "blocks.0-95"
    assert span_name("embed", "head") == "embed..head"
    assert short_name(span_name("blocks.0.ln1..blocks.0.attn", "blocks.31.ln1..blocks.31.attn")) \
        == "blocks.0-31.ln1..attn"
