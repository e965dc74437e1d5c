"""Headroom (issue 18): `--headroom` parsing, its subtraction, and the usable budget every plan states."""
from __future__ import annotations

import json

import pytest

from shardsched.cli import main
from shardsched.cost.device import DEVICES, GiB
from shardsched.cost.headroom import Headroom, headroom_for, parse_headroom, usable_budget
from shardsched.errors import UsageError

MiB = 1 << 20


@pytest.mark.parametrize("text, fraction, fixed", [
    ("5%", 0.05, 0), ("2GiB", 0.0, 2 * GiB), ("5%+1GiB", 0.05, GiB), ("1GiB+5%", 0.05, GiB), ("0", 0.0, 0),
    ("0%", 0.0, 0), ("512MiB", 0.0, 512 * MiB), ("2.5%+100MB", 0.025, 100 * 10**6), ("4096", 0.0, 4096),
])
def test_parse_accepted_forms(text, fraction, fixed):
    h = parse_headroom(text)
    assert h.fraction == pytest.approx(fraction) and h.fixed_bytes == fixed


@pytest.mark.parametrize("text", ["abc", "5%+5%", "100%", "-1", "1GiB+2GiB", "5%+", "+", "5 %%", "1e9", "5%+1GiB+1"])
def test_parse_refuses_other_forms_in_one_line(text):
    with pytest.raises(UsageError) as e:
        parse_headroom(text)
    assert "\n" not in str(e.value) and "accepted" in str(e.value)


def test_subtraction_closed_form():
    h = Headroom(fraction=0.05, fixed_bytes=GiB)
    b = usable_budget(40 * GiB, device_memory=80 * GiB, headroom=h)
    assert b.given == 40 * GiB and b.headroom_bytes == 2 * GiB + GiB and b.usable == 37 * GiB
    # No budget given: the device's memory is the budget.
    b = usable_budget(None, device_memory=80 * GiB, headroom=h)
    assert b.given is None and b.usable == 80 * GiB - 4 * GiB - GiB
    assert parse_headroom(h.text) == h
    with pytest.raises(UsageError, match="leaves nothing"):
        usable_budget(GiB, device_memory=80 * GiB, headroom=Headroom(fixed_bytes=GiB))


def test_device_defaults():
    """GPUs: 5% + 1 GiB; cpu: none, so CPU plans and their tests keep their budgets."""
    assert headroom_for(None, DEVICES["cpu"]) == Headroom()
    for name in ("v100", "a100", "h100", "h200"):
        assert headroom_for(None, DEVICES[name]) == Headroom(fraction=0.05, fixed_bytes=GiB)
    assert headroom_for("0", DEVICES["h100"]) == Headroom()


def _plan_json(capsys, *args) -> dict:
    assert main(["plan", "--model", "small", "--world", "8", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_plan_states_its_usable_budget(capsys):
    plan = _plan_json(capsys, "--device", "a100", "--memory-budget", "3GiB")
    assert plan["memory_budget_bytes"] == 3 * GiB
    assert plan["headroom_bytes"] == int(0.05 * 3 * GiB) + GiB
    assert plan["usable_budget_bytes"] == 3 * GiB - plan["headroom_bytes"]
    assert plan["predicted"]["peak_bytes"] <= plan["usable_budget_bytes"]
    # cpu: no headroom by default; --headroom takes it off.
    plan = _plan_json(capsys, "--device", "cpu", "--memory-budget", "1GiB")
    assert plan["usable_budget_bytes"] == GiB and plan["headroom_bytes"] == 0
    plan = _plan_json(capsys, "--device", "cpu", "--memory-budget", "1GiB", "--headroom", "10%+64MiB")
    assert plan["usable_budget_bytes"] == GiB - int(0.1 * GiB) - 64 * MiB
    # No budget: the device's memory less its headroom, and the budget stays null.
    plan = _plan_json(capsys, "--device", "h200")
    assert plan["memory_budget_bytes"] is None
    mem = DEVICES["h200"].memory_bytes
    assert plan["usable_budget_bytes"] == mem - int(0.05 * mem) - GiB


def test_headroom_is_taken_before_planning(capsys):
    """The auto plan under budget B with headroom H is the plan under B - H with none, and
    the headroom binds here (32 MiB and 24 MiB plans differ for this model)."""
    a = _plan_json(capsys, "--device", "cpu", "--memory-budget", "32MiB", "--headroom", "8MiB")
    b = _plan_json(capsys, "--device", "cpu", "--memory-budget", "24MiB", "--headroom", "0")
    full = _plan_json(capsys, "--device", "cpu", "--memory-budget", "32MiB")
    assert a["usable_budget_bytes"] == b["usable_budget_bytes"] == 24 * MiB
    assert a["units"] == b["units"] and a["predicted"] == b["predicted"]
    assert a["predicted"]["peak_bytes"] <= 24 * MiB < full["predicted"]["peak_bytes"]
    assert a["predicted"]["step_seconds"] > full["predicted"]["step_seconds"]


def test_printout_states_the_usable_budget(capsys):
    assert main(["plan", "--model", "small", "--device", "a100", "--memory-budget", "3GiB"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the table wraps at 80 columns
    assert "budget 3.00 GiB, usable 1.85 GiB after 1.15 GiB headroom" in out


def test_bad_headroom_is_one_line_exit_2(capsys):
    for args in (["--headroom", "5%%"], ["--headroom", "3GiB", "--memory-budget", "2GiB"]):
        assert main(["plan", "--model", "tiny", "--device", "cpu", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--headroom" in err and "Traceback" not in err


def test_plan_files_with_bad_budget_fields_are_refused(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny", "--world", "2", "--device", "cpu", "--out", str(path)]) == 0
    good = json.loads(path.read_text())
    assert good["usable_budget_bytes"] == DEVICES["cpu"].memory_bytes and good["headroom_bytes"] == 0
    for key, value in (("usable_budget_bytes", -1), ("headroom_bytes", -5), ("usable_budget_bytes", "x")):
        path.write_text(json.dumps({**good, key: value}))
        capsys.readouterr()
        assert main(["plan", "--model", "tiny", "--world", "2", "--device", "cpu", "--plan", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and key in err, err
