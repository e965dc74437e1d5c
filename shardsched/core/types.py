"""The Plan: units, strategies, schedule, predictions, and how it was solved.

Plain frozen data, kept apart from the code that makes it (`solve.build`,
`solve.milp`, `solve.greedy`) and the code that applies it (`runtime.parallelize`).
Its JSON keys are a contract other tools read (../shared/DESIGN.md, "Contracts").
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

from shardsched._json import from_dict, loads_strict, to_dict

PLAN_VERSION = 1


class Strategy(str, enum.Enum):
    """How one unit is data-parallel."""

    REPLICATE = "replicate"
    """DDP: full replica, gradients all-reduced."""
    SHARD_GRAD_OP = "shard_grad_op"
    """ZeRO-2: gathered once before forward, kept until its backward ends."""
    FULL_SHARD = "full_shard"
    """ZeRO-3: gathered before forward, freed after it, gathered again for backward."""
    FULL_SHARD_NODE = "full_shard_node"
    """ZeRO-3 sharded over the world, resharded to the node after forward (ZeRO++ hpZ,
    FSDP2 `reshard_after_forward=gpus_per_node`): a node-sized shard stays resident
    until backward, whose AllGather is intra-node. Printed `full_shard/node`."""
    HYBRID_SHARD = "hybrid_shard"
    """HSDP (MiCS): full_shard inside the node, replicated across nodes; gradients
    reduce-scattered inside the node, then all-reduced across nodes."""
    HYBRID_SHARD_GRAD_OP = "hybrid_shard_grad_op"
    """HSDP with shard_grad_op inside the node: gathered once, kept until backward ends."""

    @property
    def label(self) -> str:
        """How reports print it (`full_shard/node`); the value is what JSON holds."""
        return "full_shard/node" if self is Strategy.FULL_SHARD_NODE else self.value

    @property
    def gathers_for_backward(self) -> bool:
        """Freed (or resharded) after forward, so backward gathers it again."""
        return self in (Strategy.FULL_SHARD, Strategy.FULL_SHARD_NODE, Strategy.HYBRID_SHARD)

    @property
    def multi_node(self) -> bool:
        """Only meaningful when the world spans more than one node."""
        return self in (Strategy.FULL_SHARD_NODE, Strategy.HYBRID_SHARD, Strategy.HYBRID_SHARD_GRAD_OP)

    @classmethod
    def parse(cls, word: str) -> "Strategy":
        """A value or a printed label (`full_shard/node`); ValueError otherwise."""
        return cls("full_shard_node" if word == "full_shard/node" else word)


class GradSync(str, enum.Enum):
    """When gradients are reduced under gradient accumulation (several micro-batches per step)."""

    EVERY = "every"
    """After every micro-batch (FSDP2's default): sharded gradients accumulate, K reductions."""
    LAST = "last"
    """Only after the last micro-batch (`set_requires_gradient_sync(False)` before the others,
    as torchtitan does): unsharded gradients accumulate, one reduction per step."""


class Checkpoint(enum.Enum):
    """Activation checkpointing of a unit's layers, each layer on its own.

    [Note: checkpoint modes in plan JSON]
    The values are what plan JSON holds: `false` and `true` as plans wrote before
    selective checkpointing existed (so old plans read unchanged), and the string
    "selective-op" (`+sac`) and "selective" (`+sac-all`), which a reader that only knows
    booleans rejects rather than reading them as on or off. "none" and "full" are read too. Truthiness is "recomputes in
    backward" (selective or full), which is what `if unit.checkpoint` meant before."""

    NONE = False
    """Forward saves what autograd saves; nothing is recomputed."""
    SELECTIVE = "selective-op"
    """Op-level (PyTorch's `create_selective_checkpoint_contexts`) with torchtitan's op
    policy (`+sac`): the outputs of attention, convolutions and every other matmul are saved,
    the rest recomputed (`core.sac_policy`)."""
    SELECTIVE_ALL = "selective"
    """Op-level with every matmul's output saved (`+sac-all`; what `+sac` meant before issue
    28, so plans that wrote "selective" read as what they ran)."""
    FULL = True
    """Whole-layer: forward keeps only the layers' inputs, backward recomputes the forward."""

    @classmethod
    def _missing_(cls, value):
        return {"none": cls.NONE, "full": cls.FULL}.get(value) if isinstance(value, str) else None

    def __bool__(self) -> bool:
        return self is not Checkpoint.NONE

    @property
    def suffix(self) -> str:
        """How strategy words and reports write it: "", "+sac", "+sac-all" or "+ckpt"."""
        return {Checkpoint.NONE: "", Checkpoint.SELECTIVE: "+sac", Checkpoint.SELECTIVE_ALL: "+sac-all",
                Checkpoint.FULL: "+ckpt"}[self]

    @property
    def selective(self) -> bool:
        """Op-level checkpointing, under either policy."""
        return self in (Checkpoint.SELECTIVE, Checkpoint.SELECTIVE_ALL)


class Precision(str, enum.Enum):
    FP32 = "fp32"
    """Everything in fp32: 4-byte params, grads and compute copies."""
    BF16_MIXED = "bf16-mixed"
    """fp32 master params and grads at rest, bf16 gathered params and compute."""


class Optimizer(str, enum.Enum):
    ADAM = "adam"
    """Adam/AdamW: two fp32 moments, 8 bytes per parameter."""
    SGD = "sgd"
    """SGD with momentum: one fp32 buffer, 4 bytes per parameter."""


@dataclass(frozen=True, kw_only=True)
class Unit:
    """Consecutive layers sharded and communicated together (one `fully_shard`)."""

    name: str
    """The unit's name: the module path `fully_shard` is applied to (its first layer
    when it is a single layer, else the first layer's path plus "+")."""
    layers: tuple[str, ...]
    """Module paths of its layers, in execution order."""
    strategy: Strategy
    params: int
    """Parameter count (elements)."""
    forward_prefetch: tuple[str, ...] = ()
    """Units whose AllGather is launched at the start of this unit's forward."""
    backward_prefetch: tuple[str, ...] = ()
    """Units whose AllGather is launched at the start of this unit's backward."""
    checkpoint: Checkpoint = Checkpoint.NONE
    """Activation checkpointing of each of its layers (`Checkpoint`): full keeps only the
    layers' inputs and recomputes their forward in backward, selective also keeps the
    outputs of matmuls and attention and recomputes the rest (absent in older plans: none)."""

    def __post_init__(self):  # a bool (older code, tests) reads as NONE / FULL
        object.__setattr__(self, "checkpoint", Checkpoint(self.checkpoint))

    @property
    def display_name(self) -> str:
        """The name as reports print it: the root unit (named "") is "(root)", not a blank."""
        return self.name or "(root)"

    @property
    def strategy_words(self) -> str:
        """The strategy with its checkpointing, as `--strategy` and reports write it: "full_shard+ckpt"."""
        return self.strategy.value + self.checkpoint.suffix


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Per-worker bytes at the predicted peak, by kind."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0
    activations: int = 0
    comm_buffers: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.comm_buffers


@dataclass(frozen=True, kw_only=True)
class Predicted:
    peak_bytes: int = 0
    step_seconds: float = 0.0
    compute_seconds: float = 0.0
    exposed_comm_seconds: float = 0.0
    lower_bound_seconds: float = 0.0
    model_states_bytes: int = 0
    memory: MemoryBreakdown = MemoryBreakdown()
    peak_at: str = ""
    """The compute step where the peak occurs, e.g. "B:blocks.3" or "opt"."""
    comm_seconds: float = 0.0
    """Total communication time on the wire (all collectives, serial)."""


@dataclass(frozen=True, kw_only=True)
class SolverInfo:
    name: str = "uniform"
    """"highs", "greedy", "uniform", "brute" or "manual"."""
    status: str = "n/a"
    gap: float | None = 0.0
    """Relative gap of `step_seconds` over `bound` (auto: over the whole `search_space`);
    None when no bound is known."""
    seconds: float = 0.0
    bound: float | None = None
    """A proven lower bound on the step seconds of every plan in `search_space` (auto)."""
    search_space: dict = field(default_factory=dict)
    """What the auto planner searched (groupings, strategies, checkpointing, launch window,
    work limit); empty for plans it did not make."""


@dataclass(frozen=True, kw_only=True)
class Verified:
    """What one whole step measured when PyTorch's engine ran the plan (`shardsched.verify`):
    the same `parallelize` the runtime uses, on fake tensors over a fake process group at the
    plan's world, every micro-batch, backward and the optimizer step, counted by
    FSDPMemTracker (MemTracker for plans that run on DDP)."""

    peak_bytes: int
    """The measured peak per worker (the worst rank: every rank of the fake group runs alike)."""
    peak_at: str = ""
    """The moment and the innermost module where the peak happened, e.g. "backward of blocks.3"."""
    memory: dict = field(default_factory=dict)
    """The tracker's bytes at the peak by kind ("Activation", "OptState", "All Gather", ...)."""
    engine: str = "fsdp2"
    """"fsdp2", or "ddp" for all-replicate fp32 plans (`runtime.ddp.runs_on_ddp`)."""
    tensors: str = "fake"
    """"fake" (FakeTensorMode: nothing allocated) or "real" (a model whose ops need real
    values, e.g. a boolean-mask loss, ran for real on this machine)."""
    unused_params: tuple[str, ...] = ()
    """Parameters that received no gradient in the step (DDP must be told: `runtime.ddp`).
    (No timing is kept: a plan's JSON is the same on every run; `bench/bench_verify.py`
    times verification.)"""


@dataclass(frozen=True, kw_only=True)
class Plan:
    version: int = PLAN_VERSION
    fingerprint: str
    model: str = ""
    world: int
    gpus_per_node: int
    memory_budget_bytes: int | None = None
    """The per-worker budget given (`--memory-budget`); None: none given."""
    usable_budget_bytes: int | None = None
    """What the plan was fitted to: `memory_budget_bytes` (or, with none, the device's memory)
    less `headroom_bytes` (`cost.headroom`). None in plans made before headroom existed."""
    headroom_bytes: int = 0
    """Bytes of the budget `--headroom` left free (CUDA context, NCCL buffers, fragmentation)."""
    precision: Precision = Precision.FP32
    optimizer: Optimizer = Optimizer.ADAM
    device: str = "cpu"
    micro_batch: int = 1
    """Rows of one worker's micro-batch (the shape the model was profiled at)."""
    seq: int = 0
    accumulation: int = 1
    """Micro-batches per optimizer step on each worker (gradient accumulation; 1: none)."""
    grad_sync: GradSync = GradSync.EVERY
    """When gradients are reduced if accumulation > 1 (absent in older plans: every micro-batch)."""
    units: tuple[Unit, ...]
    predicted: Predicted = Predicted()
    solver: SolverInfo = SolverInfo()
    notes: tuple[str, ...] = ()
    """Human-readable remarks: why strategies were chosen, oversized layers, ..."""
    verified: Verified | None = None
    """The engine's measurement of this plan (`shardsched.verify`); None: not verified
    (`--no-verify`, or a plan made before verification existed)."""
    extra: dict = field(default_factory=dict)
    # issue 27 (s11-solve): kept apart, with a default, so plans without it still load
    strategy_spec: str = ""
    """A `--strategy` that `make_plan` turns into this plan's units, strategies, checkpointing and
    launches ([Note: exact specs] in plan/spec.py); "" where none was recorded."""

    def unit(self, name: str) -> Unit:
        for u in self.units:
            if u.name == name:
                return u
        raise KeyError(name)

    def to_json(self) -> str:
        return json.dumps(to_dict(self), indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Plan":
        """Parse a plan; ValueError with one line on anything malformed
        (the schema only: `plan.validate` checks the plan's own consistency)."""
        try:
            data = loads_strict(text)
        except ValueError as e:
            raise ValueError(f"plan: {e}") from None
        if not isinstance(data, dict) or type(data.get("version")) is not int or data["version"] != PLAN_VERSION:
            raise ValueError(f"plan has no 'version': {PLAN_VERSION} (not a shardsched plan, or another schema)")
        return from_dict(cls, data)
