"""Calibration (`shardsched profile`): the fits recover known figures exactly from
exact timings, a real 2-worker run writes a readable cluster file, and `plan`,
`train` take that file with `--cluster`."""
import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from shardsched.cli import main
from shardsched.cost.comm import Collective, collective_seconds
from shardsched.cost.device import DEVICES, Cluster, Link, cluster_file_text, read_cluster_file
from shardsched.profile import calibrate as cal
from shardsched.profile.calibrate import HostPerOp, Sample, fit_efficiency, fit_link, fitted_device

SIZES = (4096, 65536, 1 << 20, 1 << 24)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_link_fit_recovers_alpha_and_bandwidth_from_exact_timings(world):
    link = Link(alpha_seconds=123e-6, bandwidth=1.7e9)
    cluster = Cluster(world=world, gpus_per_node=world, device=dataclasses.replace(DEVICES["cpu"], intra=link))
    # The timings `cost.comm` predicts for this link: the fit must give the link back.
    samples = [Sample(kind=k, nbytes=n, seconds=collective_seconds(k, n, cluster)) for k in Collective for n in SIZES]
    fit = fit_link(samples, world=world)
    assert fit.alpha_seconds == pytest.approx(123e-6, rel=1e-9)
    assert fit.bandwidth == pytest.approx(1.7e9, rel=1e-9)
    assert fit.rel_error < 1e-9
    # One collective alone determines the link as well.
    only_ar = fit_link([s for s in samples if s.kind is Collective.ALL_REDUCE], world=world)
    assert only_ar.alpha_seconds == pytest.approx(123e-6, rel=1e-9) and only_ar.bandwidth == pytest.approx(1.7e9)


def test_link_fit_reports_its_error():
    cluster = Cluster(world=2, gpus_per_node=2, device=DEVICES["cpu"])
    exact = [Sample(kind=Collective.ALL_GATHER, nbytes=n, seconds=collective_seconds(Collective.ALL_GATHER, n, cluster))
             for n in SIZES]
    noisy = [s._replace(seconds=s.seconds * f) for s, f in zip(exact, (1.2, 0.8, 1.2, 0.8))]
    fit = fit_link(noisy, world=2)
    assert 0.05 < fit.rel_error < 0.25 and fit.alpha_seconds >= 0 and fit.bandwidth > 0


def test_efficiency_fit_is_exact_and_weighs_relative_error():
    peak = 100e9
    flops = [1e6, 1e7, 1e8]
    fit = fit_efficiency(flops, [f / (peak * 0.37) for f in flops], peak_flops=peak)
    assert fit.efficiency == pytest.approx(0.37, rel=1e-12) and fit.rel_error < 1e-12
    # Closed form of min sum((F x - t)/t)^2 with r = F/t: x = sum(r) / sum(r^2).
    seconds = [2e-5, 5e-4, 3e-3]
    r = [f / t for f, t in zip(flops, seconds)]
    x = sum(r) / sum(v * v for v in r)
    assert fit_efficiency(flops, seconds, peak_flops=peak).efficiency == pytest.approx(1 / (x * peak), rel=1e-12)


def test_bandwidth_fit_is_exact_and_matches_a_brute_force_minimum():
    nbytes = [1 << 20, 1 << 24, 1 << 26]
    assert cal.fit_bandwidth([(b, b / 2.5e12) for b in nbytes]) == pytest.approx(2.5e12, rel=1e-12)
    # Noisy timings: the closed form is the minimum of the relative residuals over a fine grid.
    samples = [(b, b / 2.5e12 * f) for b, f in zip(nbytes, (1.3, 0.9, 1.05))]
    grid = np.linspace(1e12, 4e12, 300_001)
    loss = sum((1 - b / (grid * t)) ** 2 for b, t in samples)
    assert cal.fit_bandwidth(samples) == pytest.approx(grid[np.argmin(loss)], rel=1e-5)
    # A fixed cost per call (a GPU's host time, priced apart): only the slope is bandwidth.
    launch = [(b, 1e-4 + b / 4e12) for b in nbytes]
    assert cal.fit_bandwidth(launch, fixed=True) == pytest.approx(4e12, rel=1e-9)
    assert cal.fit_bandwidth(launch) < 0.5 * 4e12


def test_fitted_device_round_trips_through_a_cluster_file(tmp_path):
    base = DEVICES["cpu"]
    cluster = Cluster(world=2, gpus_per_node=2, device=dataclasses.replace(
        base, intra=Link(alpha_seconds=2e-4, bandwidth=5e8)))
    samples = [Sample(kind=k, nbytes=n, seconds=collective_seconds(k, n, cluster)) for k in Collective for n in SIZES]
    compute = {c: [(f, f / (base.peak_flops * e)) for f in (1e6, 1e8)]
               for c, e in (("matmul", 0.3), ("attention", 0.1))}
    calib = fitted_device(base, samples=samples, compute=compute, optimizer=(1 << 20, 0.02),
                          elementwise=[(n, n / 3e9) for n in (1 << 20, 1 << 24)],
                          unit_overhead=3e-3, tensor_overhead=4e-4, world=2, state_bytes_at_rest=16,
                          op_host=HostPerOp(plain=5e-5, recompute=3e-5, selective=6e-5))
    path = tmp_path / "cluster.json"
    path.write_text(cluster_file_text(calib.device, fit=calib.fit))
    dev = read_cluster_file(str(path))
    assert dev == calib.device
    assert dev.intra.alpha_seconds == pytest.approx(2e-4) and dev.intra.bandwidth == pytest.approx(5e8)
    assert dev.efficiency == pytest.approx({"matmul": 0.3, "attention": 0.1})
    assert dev.mfu == pytest.approx(0.3) and dev.inter == base.inter
    # elementwise operators and the optimizer step each get their own bandwidth
    assert dev.memory_bandwidth == pytest.approx(3e9)
    assert dev.optimizer_bytes_per_second == pytest.approx(2 * 16 * (1 << 20) / 0.02)
    assert dev.unit_overhead_seconds == 3e-3 and dev.tensor_overhead_seconds == 4e-4
    # the host's time per operator ([Note: host time per op] in plan/schedule.py)
    assert (dev.op_host_seconds, dev.recompute_op_host_seconds, dev.sac_op_host_seconds) == (5e-5, 3e-5, 6e-5)
    # Each collective's own fit travels in the file (here all three come from one link).
    assert set(dev.collectives) == {k.value for k in Collective}
    for k in Collective:
        assert dev.intra_link(k.value).bandwidth == pytest.approx(5e8) and isinstance(dev.collectives[k.value], Link)
    assert dev.compute_seconds({"matmul": 3e9}) == pytest.approx(3e9 / (base.peak_flops * 0.3))


def test_real_two_worker_calibration_feeds_plan(tmp_path, capsys):
    out = tmp_path / "cluster.json"
    # A fresh interpreter and `--json`: stdout is the fit report and nothing else (issue 17).
    r = subprocess.run([sys.executable, "-m", "shardsched", "profile", "--nproc", "2", "--out", str(out),
                        "--repeats", "1", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads(out.read_text())["fit"]
    dev = read_cluster_file(str(out))
    figures = [dev.intra.alpha_seconds, dev.intra.bandwidth, dev.memory_bandwidth, dev.optimizer_bandwidth,
               dev.mfu, *dev.efficiency.values()]
    assert set(dev.efficiency) == {"matmul", "attention"}
    assert all(math.isfinite(v) and v > 0 for v in figures), figures
    assert math.isfinite(dev.unit_overhead_seconds) and dev.unit_overhead_seconds >= 0
    assert math.isfinite(dev.tensor_overhead_seconds) and dev.tensor_overhead_seconds >= 0
    assert set(dev.collectives) == {k.value for k in Collective}
    fit = json.loads(out.read_text())["fit"]
    assert all(math.isfinite(f["rel_error"]) for f in [fit["link"], *fit["compute"].values()])

    # `plan --cluster` prices with the file's device, not a preset.
    assert main(["plan", "--model", "tiny", "--world", "2", "--cluster", str(out), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    from shardsched.solve.build import make_plan
    from shardsched.profile.analytic import analytic_profile
    from shardsched.models.spec import PRESETS
    want = make_plan(analytic_profile(PRESETS["tiny"], micro_batch=1, seq=128, device=dev, compute_dtype="float32",
                                      name="tiny"),
                     Cluster(world=2, gpus_per_node=2, device=dev), strategy="full_shard")
    assert plan["predicted"]["step_seconds"] == pytest.approx(want.predicted.step_seconds, rel=1e-9)


@pytest.mark.parametrize("argv, fragment", [
    (["profile", "--nproc", "0"], "--nproc must be at least 1"),
    (["profile", "--out", "/no/such/dir/c.json"], "directory /no/such/dir does not exist"),
    (["profile", "--device", "tpu"], "unknown device 'tpu'"),
    (["plan", "--model", "tiny", "--cluster", "/no/such/cluster.json"], "not a cluster file"),
    (["train", "--cluster", "/no/such/cluster.json"], "not a cluster file"),
])
def test_bad_input_is_one_line(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_a_gpu_times_shapes_large_enough_not_to_be_launch_bound():
    """On an H200 the CPU's shapes fitted a matmul efficiency of 0.002 and 77 GB/s (launches, not
    kernels: docs/design.md, "Checked on a GPU"); a GPU times a 1-8B model's shapes, in bf16."""
    import torch

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    matmuls, attentions, elementwise = cal.shapes(cuda)
    # >= 0.1 TFLOP per matmul forward+backward: ~0.3 ms at H100 peak, 100x a kernel launch
    assert min(3 * 2 * m * k * n for m, k, n in matmuls) >= 1e11
    assert min(b * h * s * s * d for b, h, s, d in attentions) >= 1e10
    assert min(elementwise) >= 1 << 24
    assert cal.shapes(cpu) == (cal.MATMULS, cal.ATTENTIONS, cal.ELEMENTWISE)
    assert cal.calibration_dtype(cuda) is torch.bfloat16 and cal.calibration_dtype(cpu) is torch.float32
    params, seconds = cal.time_optimizer(device=cpu, repeats=1)
    assert params == 1 << 20 and seconds > 0 and cal.CUDA_OPTIMIZER_PARAMS >= 1 << 27
