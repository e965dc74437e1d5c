"""Plans with no search: a uniform, override or exact spec planned directly (block-size fusion,
FSDP2's default one-ahead prefetch, or the launches as written), and any Scenario made a Plan
with its predictions and notes (`plan_from_scenario`, which the auto planner's answer goes
through too). `solve.build.make_plan` dispatches here or to `solve.auto`."""
from __future__ import annotations

import dataclasses
import time

from shardsched.cost.device import Cluster
from shardsched.plan.schedule import make_scenario, units_with_schedule
from shardsched._fmt import short_name
from shardsched.errors import UsageError
from shardsched.plan.spec import ACCEPTED, StrategySpec, _match
from shardsched.core.types import Checkpoint, GradSync, Optimizer, Plan, Precision, SolverInfo
from shardsched.plan.units import ROOT, group_layers, layer_strategies, partition, root_strategy, unit_cost
from shardsched.profile.types import Profile
from shardsched.sim.scenario import Scenario, default_launch
from shardsched.sim.simulate import simulate
from shardsched.solve.candidates import block_params


def direct_plan(profile: Profile, cluster: Cluster, spec: StrategySpec, *, precision: Precision,
                optimizer: Optimizer, memory_budget_bytes: int | None = None, fuse: bool = True,
                prefetch_ahead: int = 1, accumulation: tuple[int, GradSync] | None = None) -> Plan:
    """The plan for a spec that is not "auto" (`make_plan`'s arguments, the spec parsed)."""
    t0 = time.perf_counter()
    names = [layer.name for layer in profile.layers]
    if spec.exact or _names_a_child(spec, profile):
        sc = exact_scenario(profile, cluster, spec, precision=precision, optimizer=optimizer)
        if accumulation:
            sc = dataclasses.replace(sc, accumulation=accumulation[0], grad_sync=accumulation[1])
        solver = SolverInfo(name="manual", status="given", seconds=time.perf_counter() - t0)
        return plan_from_scenario(sc, profile=profile, memory_budget_bytes=memory_budget_bytes,
                                  solver=solver, precision=precision, optimizer=optimizer)
    per_layer, ckpt = spec.for_layers(names), spec.checkpointed(names)
    strategies = layer_strategies(profile, [per_layer[n] for n in names])
    keys = [(s, ckpt[n] if n != ROOT else Checkpoint.NONE) for s, n in zip(strategies, names)]  # never the root
    block = block_params(cluster, precision, optimizer) if fuse else 0
    groups = group_layers(profile, keys, block_params=block)
    costs = [unit_cost([profile.layers[i] for i in g], keys[g[0]][1]) for g in groups]
    strats = [keys[g[0]][0] for g in groups]
    fwd, bwd = default_launch(tuple(strats), ahead=prefetch_ahead)
    sc = make_scenario(costs, strats, fwd, bwd, profile=profile, cluster=cluster,
                       precision=precision, optimizer=optimizer, checkpoint=[keys[g[0]][1] for g in groups])
    if accumulation:
        sc = dataclasses.replace(sc, accumulation=accumulation[0], grad_sync=accumulation[1])
    solver = SolverInfo(name="uniform" if not spec.overrides else "manual", status="given",
                        seconds=time.perf_counter() - t0)
    return plan_from_scenario(sc, profile=profile, memory_budget_bytes=memory_budget_bytes,
                              solver=solver, precision=precision, optimizer=optimizer)


def _names_a_child(spec, profile: Profile) -> bool:
    kids = [c.name for layer in profile.layers for c in layer.children]
    layers = [layer.name for layer in profile.layers]
    return any(_children_named(key, kids, layers) for key, _ in spec.overrides)


def _children_named(key: str, kids: list[str], layers: list[str]) -> list[str]:
    """The children a key names. A glob that names layers names none of their children:
    `blocks.*=full_shard+ckpt` checkpoints every block, it does not split them."""
    if any(c in key for c in "*?[") and _match(key, layers):
        return []
    return _match(key, kids)


def exact_scenario(profile: Profile, cluster: Cluster, spec, *, precision: Precision,
                   optimizer: Optimizer) -> Scenario:
    """The scenario an exact spec names ([Note: exact specs] in `plan/spec.py`): layers split into
    their children where a key names one, one unit per layer or child except `A..B` ranges, the
    launches as written."""
    kids = {c.name: layer.name for layer in profile.layers for c in layer.children}
    keys = [key for key, _ in spec.overrides]
    names = [layer.name for layer in profile.layers]
    split = {kids[name] for key in keys
             for name in (key.split("..") if ".." in key else _children_named(key, list(kids), names)) if name in kids}
    atoms, owner = [], []
    for layer in profile.layers:
        parts = partition(layer) if layer.name in split and layer.children else [layer]
        atoms += parts
        owner += [layer.name] * len(parts)
    anames = [a.name for a in atoms]

    def hits(key: str) -> list[int]:
        if ".." in key:
            got = _match(key, anames)
            if not got:
                raise UsageError(f"strategy key {key!r} is no range A..B of consecutive units (units: "
                                 f"{', '.join(map(short_name, anames[:6]))}, ...); {ACCEPTED}")
            return [anames.index(n) for n in got]
        direct = set(_match(key, anames)) | set(_match(key, [o for o in dict.fromkeys(owner)]))
        got = [i for i, (a, o) in enumerate(zip(anames, owner)) if a in direct or (o in direct and o != a)]
        if not got:
            raise UsageError(f"strategy override {key!r} matches no layer (layers: "
                             f"{', '.join(map(short_name, anames[:6]))}, ...)")
        return got

    strat = [spec.default] * len(atoms)
    mode = [Checkpoint.NONE] * len(atoms)
    launch: list = [None] * len(atoms)
    for key, k in spec.overrides:
        for i in hits(key):
            strat[i] = k
    for key, m in spec.checkpoint:
        for i in (range(len(atoms)) if key == "*" else hits(key)):
            mode[i] = m
    for key, at in spec.launch:
        for i in hits(key):
            launch[i] = at
    groups, taken = [], set()
    for key in keys:
        if ".." in key:
            g = hits(key)
            if taken & set(g) or any(anames[i] == ROOT for i in g) and len(g) > 1:
                raise UsageError(f"strategy key {key!r} overlaps another unit or fuses the root; {ACCEPTED}")
            taken |= set(g)
            groups.append(g)
    groups += [[i] for i in range(len(atoms)) if i not in taken]
    groups.sort()
    strats, modes, costs = [], [], []
    for g in groups:
        if len({(strat[i], mode[i], launch[i]) for i in g}) > 1:
            raise UsageError(f"unit {short_name(anames[g[0]])}..{short_name(anames[g[-1]])} is given more than one "
                             f"strategy, checkpointing or launch; {ACCEPTED}")
        root = anames[g[0]] == ROOT
        strats.append(root_strategy(strat[g[0]]) if root else strat[g[0]])
        modes.append(Checkpoint.NONE if root else mode[g[0]])
        costs.append(unit_cost([atoms[i] for i in g], modes[-1]))
    n = len(groups)
    fwd, bwd = (list(x) for x in default_launch(tuple(strats), ahead=spec.ahead if spec.ahead is not None else 1))
    for u, g in enumerate(groups):
        at = launch[g[0]]
        if at is None:
            continue
        f, b = at
        use = 2 * n - 1 - u
        if f > u or (b not in (None, "") and b > use):
            raise UsageError(f"launch @{f}/{b} of unit {short_name(anames[g[0]])} is outside the step "
                             f"(unit {u} of {n}); {ACCEPTED}")
        fwd[u] = u - f
        if not strats[u].gathers_for_backward or b is None:
            bwd[u] = None
        elif b != "":
            bwd[u] = use - b
    return make_scenario(costs, strats, tuple(fwd), tuple(bwd), profile=profile, cluster=cluster,
                         precision=precision, optimizer=optimizer, checkpoint=modes)


def plan_from_scenario(sc: Scenario, *, profile: Profile, memory_budget_bytes: int | None,
                       solver: SolverInfo, precision: Precision, optimizer: Optimizer,
                       notes: tuple[str, ...] = ()) -> Plan:
    pred = simulate(sc).predicted
    notes = notes + tuple(budget_notes(pred.peak_bytes, memory_budget_bytes))
    notes = notes + tuple(oversized_layer_notes(sc, memory_budget_bytes))
    return Plan(fingerprint=profile.fingerprint, model=profile.model, world=sc.cluster.world,
                gpus_per_node=sc.cluster.gpus_per_node, memory_budget_bytes=memory_budget_bytes,
                precision=precision, optimizer=optimizer, device=sc.cluster.device.name,
                micro_batch=profile.micro_batch, seq=profile.seq, units=units_with_schedule(sc),
                accumulation=sc.accumulation, grad_sync=sc.grad_sync,
                predicted=pred, solver=solver, notes=notes, extra=_inputs_extra(profile))


def _inputs_extra(profile: Profile) -> dict:
    """A python: model's inputs with no batch dimension, as the plan states them instead of
    a micro-batch (`profile.measure.inputs_words`)."""
    return {"inputs": profile.extra["inputs"]} if "inputs" in profile.extra else {}


def budget_notes(peak: int, budget: int | None) -> list[str]:
    if budget is None or peak <= budget:
        return []
    return [f"predicted peak {peak / 2**30:.2f} GiB exceeds the budget {budget / 2**30:.2f} GiB"]


def oversized_layer_notes(sc: Scenario, budget: int | None) -> list[str]:
    """Units that cannot fit however they are scheduled: while one computes its
    backward, its gathered parameters, its unsharded gradients and its reduction
    buffer are all live, whatever the strategy."""
    if budget is None:
        return []
    sb, out = sc.state, []
    for u in sc.units:
        alone = u.params * (sb.unsharded_param + sb.unsharded_grad + sb.reduce)
        if alone > budget:
            out.append(f"{u.name} alone needs {alone} bytes while it computes its backward (gathered parameters, "
                       f"gradients, reduction buffer) > budget {budget}: partition it (--strategy auto) or add memory")
    return out


