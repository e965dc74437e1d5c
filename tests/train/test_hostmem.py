"""Host memory is checked against MemAvailable before any CPU worker starts."""
import pytest

from shardsched.cli import main
from shardsched.errors import UsageError
from shardsched.models.gpt import GPT
from shardsched.train.config import model_config
from shardsched.train.hostmem import check_host_memory, mem_available, predicted_worker_bytes

from ._helpers import TINY


def test_prediction_covers_the_unsharded_model_and_zero3_states():
    world = 2
    need = predicted_worker_bytes(TINY, world=world, batch=8, seq=16, precision="fp32")
    params = sum(p.numel() for p in GPT(model_config(TINY, seq=16)).parameters())
    floor = 4 * params + 16 * params // world  # fp32 model being built + Adam states sharded (ZeRO-3)
    assert floor <= need <= 2 * floor
    check_host_memory(TINY, world=world, batch=8, seq=16, precision="fp32", available=world * need)
    with pytest.raises(UsageError) as e:
        check_host_memory(TINY, world=world, batch=8, seq=16, precision="fp32", available=world * need - 1)
    assert "host memory" in str(e.value) and "would fit" in str(e.value)


def test_meminfo_is_read(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24684096 kB\nMemAvailable:   20994204 kB\n")
    assert mem_available(str(f)) == 20994204 * 1024
    assert mem_available(str(tmp_path / "absent")) is None


def test_train_refuses_a_model_the_host_cannot_hold(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--model", "gpt3-175b", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "host memory" in err[0] and "available" in err[0]
    assert not run.exists()
