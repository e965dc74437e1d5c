"""Big models without memory: plan Llama-2-70B from its config (traced on fake tensors).

Runs `shardsched plan --model hf:meta-llama/Llama-2-70b-hf --world 512 --gpus-per-node 8
--device h100 --memory-budget 70GiB` in a child process and prints its wall time and peak
RSS (resource.getrusage of the child), and checks parameter counts against the real
architectures (GQA included). Targets: under 30 s and under 2 GB.
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

REAL = {  # parameters of the released checkpoints
    "hf:meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "hf:meta-llama/Llama-2-7b-hf": 6_738_415_616,
}


def run(args: list[str]) -> tuple[float, float, int, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "shardsched", *args, "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"plan failed: {r.stderr.strip()}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, cpu, after.ru_maxrss * 1024, json.loads(r.stdout)  # ru_maxrss: KiB on Linux


def main() -> int:
    ok = True
    for model, real in REAL.items():
        args = ["plan", "--model", model, "--world", "512", "--gpus-per-node", "8", "--device", "h100",
                "--memory-budget", "70GiB"]
        seconds, cpu, rss, plan = run(args)
        params = sum(u["params"] for u in plan["units"])
        print(f"{model}: {seconds:.1f} s wall ({cpu:.1f} s CPU: the wall time counts other load on the machine), child peak RSS {rss / 2**30:.2f} GiB, {len(plan['units'])} units, "
              f"params {params:,} (real {real:,}), predicted peak {plan['predicted']['peak_bytes'] / 2**30:.2f} GiB, "
              f"step {plan['predicted']['step_seconds']:.3f} s, solver {plan['solver']['name']}")
        ok &= params == real and seconds < 30 and rss < 2 * 2**30
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
