"""Device and cluster specs: compute speed, memory, and link alpha/bandwidth.

Figures are public numbers (../shared/DESIGN.md, "Calibration figures"):
peak dense bf16 from the vendors' datasheets (H100 SXM ~989 TFLOP/s, A100 ~312,
V100 fp16 ~125, H200 = H100), NVSwitch collectives from nccl-tests measurements on
8x H100 (AllGather/ReduceScatter ~30 us and ~394 GB/s algbw), and the 1 GbE figures
the seed prototype measured (alpha 0.235 ms, 98 MB/s). Compute time uses a fraction
of peak per op class (`efficiency`, fitted to published FSDP throughput on the A100
and H100 presets) and a model-FLOPs-utilisation factor (`mfu`) for the classes not
listed. Memory is what the part exposes, less `--headroom` (`cost.headroom`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

GiB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class Link:
    alpha_seconds: float
    """Latency per ring step. nccl-tests report ~30 us for a whole 8-GPU AllGather,
    i.e. ~30/7 us for each of its 7 ring steps."""
    bandwidth: float
    """Bytes per second one worker moves on this link (algbw of a point-to-point step)."""


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    name: str
    peak_flops: float
    """Peak dense FLOP/s in the compute dtype."""
    mfu: float
    """Fraction of peak a transformer step reaches (model FLOPs utilisation)."""
    memory_bytes: int
    """Device memory per worker."""
    intra: Link
    """Link between workers of one node (NVLink/NVSwitch, or shared memory)."""
    inter: Link
    """Link between nodes (InfiniBand/RoCE/Ethernet), per worker."""
    memory_bandwidth: float = 1e12
    """Bytes/s the memory-bound operators of a layer (norms, activations, residual adds: the
    traced profile's `moved` bytes) reach; the optimizer step's too unless `optimizer_bandwidth`
    says otherwise."""
    optimizer_bandwidth: float | None = None
    """Bytes/s of persistent state the optimizer step reads and writes (`plan.schedule`), where
    `shardsched profile` measured it apart from `memory_bandwidth`: torch's foreach AdamW runs a
    dozen list kernels per step and met 1.25-1.42 TB/s on an H200 whose elementwise kernels met
    more than twice that (`bench/gpu_check.py`). None (the presets): `memory_bandwidth`, which
    their efficiencies were fitted with."""
    unit_overhead_seconds: float = 0.0
    """Host time FSDP2 spends per unit per step (hooks, copy-in/out, DTensor
    dispatch in the optimizer). On GPUs hidden behind asynchronous kernels unless the host is
    the slower ([Note: host time per op] in plan/schedule.py); on CPU it is paid in line:
    ~3 ms per unit measured here (tiny GPT, 6 units, world 1: 67 ms per step under
    fully_shard vs 49 ms plain)."""
    tensor_overhead_seconds: float = 0.0
    """Host time FSDP2 spends per parameter tensor per step, beyond `unit_overhead_seconds`:
    the optimizer steps DTensors, and every foreach op dispatches through DTensor per
    tensor (AdamW on this 2-core CPU: ~0.4 ms per tensor against ~0.1 ms on plain
    tensors; a tiny GPT's 53 tensors cost 27 ms against 6 ms). Measured by `shardsched
    profile`; on GPUs, as `unit_overhead_seconds`, hidden unless the host is the slower."""
    op_host_seconds: float = 0.0
    """Host time per forward operator of a layer, for its forward and its backward together,
    beyond what the compute time prices ([Note: host time per op] in plan/schedule.py): Python
    and dispatch per op, kernel launches. 0 on CPUs, whose fitted efficiencies include it."""
    recompute_op_host_seconds: float = 0.0
    """Host time per forward operator a checkpointed layer recomputes in its backward."""
    sac_op_host_seconds: float = 0.0
    """Host time per forward operator that selective checkpointing adds beyond a recomputation:
    its caching and cached dispatch modes (`torch.utils.checkpoint`) run every operator of the
    layer's forward and recomputation through Python."""
    efficiency: dict[str, float] = field(default_factory=dict)
    """Fraction of `peak_flops` reached per op class ("matmul", "attention", ...),
    as fitted on a machine by `shardsched profile`; a class not listed runs at `mfu`."""
    collectives: dict[str, Link] = field(default_factory=dict)
    """The intra-node link fitted per collective ("all_gather", "reduce_scatter",
    "all_reduce") by `shardsched profile`; a collective not listed uses `intra`.
    One fit misprices backends whose collectives differ in algorithm: gloo runs
    ReduceScatter as an AllReduce plus a copy (about 3x an AllGather's time here)."""
    headroom_fraction: float = 0.0
    """Default `--headroom` share of the budget left free (allocator fragmentation; `cost.headroom`)."""
    headroom_bytes: int = 0
    """Default `--headroom` bytes left free besides (CUDA context, NCCL buffers; `cost.headroom`)."""
    comm_sm_share: float = 0.0
    """Share of the device's compute a running collective takes from the compute beside it
    (`sim.timeline` [Note: collectives slow the compute beside them]). An NCCL kernel's CTAs
    never share an SM with a compute kernel (NVIDIA/nccl#689, NCCL maintainer: "NCCL CTAs won't
    share an SM with compute kernels"), so overlapped compute runs on the other SMs: an H100
    AllGather under FSDP-style prefetch was traced holding 24 of its 132 SMs (NVIDIA developer
    forum, "Compute-Communication Overlap Causes Severe GEMM Performance Degradation because of
    Tail Effect", nsys), an A100 node with 8 NICs 16 of 108 (nccl#689). 0 where nothing overlaps
    (gloo on CPU, `overlap=False`) and on devices `shardsched profile` fits (CPU hosts)."""
    overlap: bool = True
    """Whether communication runs beside compute. NCCL collectives run on their
    own CUDA streams (FSDP2's all-gather and reduce-scatter streams), so they
    overlap; gloo on CPU runs a collective in the issuing process and FSDP2 waits
    for it, so every collective blocks compute and prefetch buys no time."""

    @property
    def optimizer_bytes_per_second(self) -> float:
        return self.optimizer_bandwidth or self.memory_bandwidth

    @property
    def flops(self) -> float:
        return self.peak_flops * self.mfu

    @property
    def overlap_share(self) -> float:
        """`comm_sm_share` where collectives run beside compute, 0 where they block it."""
        return self.comm_sm_share if self.overlap else 0.0

    def intra_link(self, collective: str) -> Link:
        """The intra-node link one collective kind runs at (`collectives`, else `intra`)."""
        return self.collectives.get(collective, self.intra)

    def compute_seconds(self, flops_by_class: dict[str, float]) -> float:
        """Time of the given FLOPs, each op class at its own efficiency."""
        return sum(f / (self.peak_flops * self.efficiency.get(c, self.mfu)) for c, f in flops_by_class.items())


MiB = 1 << 20

# Default headroom of the GPU presets (`cost.headroom`, docs/design.md "Headroom"): 5% of the
# budget for the caching allocator's fragmentation, plus 1 GiB for the CUDA context (~0.3 GB with
# lazy loading, pytorch/pytorch#107667) and NCCL's buffers (0.5-0.7 GB per communicator,
# NVIDIA/nccl#964; nccl-tests keeps 1 GiB free, NVIDIA/nccl-tests#220).
GPU_HEADROOM = dict(headroom_fraction=0.05, headroom_bytes=1 * GiB)

# Host time of the GPU presets (`DeviceSpec.*_seconds`; [Note: host time per op] in
# plan/schedule.py), measured on one NVIDIA H200's host (torch 2.11.0+cu130, a gVisor sandbox): one
# HF LlamaDecoderLayer (76 forward operators) at 256 tokens, where its kernels take no time, ran
# forward and backward in 5.10 ms of host time, 8.09 ms checkpointed and 13.57 ms under
# selective checkpointing (`+sac`); FSDP2's host work `bench/gpu_check.py`'s calibration
# fitted at 1.30 ms per unit and 0.111 ms per parameter tensor (`bench/bench_host_per_op.py`
# and `bench/gpu_check.py` print them). The same host figures stand for every GPU: hosts differ,
# and this one was the slowest of four H200 machines measured (on a Firecracker VM the same layer
# took 4.10 / 7.46 / 10.91 ms, and gpu_check's host-bound 1 x 2048 step 119-173 ms against 195 ms:
# `bench/bench_gpu_presets.py` prints each machine's rows); `shardsched profile` measures its own.
GPU_HOST = dict(op_host_seconds=5.10e-3 / 76, recompute_op_host_seconds=(8.09e-3 - 5.10e-3) / 76,
                sac_op_host_seconds=(13.57e-3 - 8.09e-3) / 76, unit_overhead_seconds=1.30e-3,
                tensor_overhead_seconds=0.111e-3)

# SMs an NCCL collective holds, over the part's SMs (`DeviceSpec.comm_sm_share`): an H100
# AllGather launched 24 blocks on 132 SMs (NVIDIA developer forum, "Compute-Communication Overlap
# Causes Severe GEMM Performance Degradation because of Tail Effect"); "on DGX with 8 NICs ... it
# would use 16 SMs" of an A100's 108 (NVIDIA/nccl#689). H200: the H100's die.
H100_NCCL_SMS = 24 / 132
A100_NCCL_SMS = 16 / 108

# Per-op-class efficiencies (fractions of peak bf16) of the A100 and H100 presets: the fit of
# `bench/bench_gpu_presets.py --fit` to published FSDP throughput (llm-foundry's MPT tables,
# torchtitan's Llama 2 13B; docs/design.md "GPU presets from public measurements"). "attention"
# prices causal attention at its masked-out half (`profile.analytic.causal_attention_flops`);
# memory is as `torch.cuda.get_device_properties().total_memory` (or nvidia-smi) reports it.
DEVICES: dict[str, DeviceSpec] = {
    # 2-core CPU worker, gloo over loopback: ~50 GFLOP/s achieved fp32 matmul. No headroom:
    # the host's allocator has no context or communicator buffers of this kind.
    "cpu": DeviceSpec(name="cpu", peak_flops=100e9, mfu=0.5, memory_bytes=24 * GiB, overlap=False,
                      unit_overhead_seconds=3e-3,
                      # selective checkpointing's dispatch modes: a tiny HF LlamaDecoderLayer (73
                      # operators) took 1.33 ms checkpointed and 2.62 ms under `+sac` here
                      # (`bench/bench_host_per_op.py --device cpu`)
                      sac_op_host_seconds=(2.62e-3 - 1.33e-3) / 73,
                      intra=Link(alpha_seconds=50e-6, bandwidth=2e9),
                      inter=Link(alpha_seconds=0.235e-3, bandwidth=98e6),
                       memory_bandwidth=10e9),
    # V100 SXM2 32GB: 125 TFLOP/s fp16, NVLink2 ~130 GB/s algbw, 100 Gb/s IB per GPU; nvidia-smi
    # shows 32510 MiB. No public FSDP measurement used: one mfu.
    "v100": DeviceSpec(name="v100", peak_flops=125e12, mfu=0.35, memory_bytes=32510 * MiB, **GPU_HEADROOM, **GPU_HOST,
                       intra=Link(alpha_seconds=25e-6 / 7, bandwidth=130e9),
                       inter=Link(alpha_seconds=5e-6, bandwidth=11e9),
                       memory_bandwidth=900e9),
    # A100 SXM4 80GB: 312 TFLOP/s bf16, NVLink3 ~230 GB/s algbw, 200 Gb/s HDR IB per GPU;
    # 81049 MiB total global memory (an A100 80GB's cudaDeviceProp, ekondis/mixbench#47).
    "a100": DeviceSpec(name="a100", peak_flops=312e12, mfu=0.4, efficiency={"matmul": 0.70, "attention": 0.33},
                       memory_bytes=81049 * MiB, **GPU_HEADROOM, **GPU_HOST, comm_sm_share=A100_NCCL_SMS,
                       intra=Link(alpha_seconds=25e-6 / 7, bandwidth=230e9),
                       inter=Link(alpha_seconds=5e-6, bandwidth=22e9),
                       memory_bandwidth=2.0e12),
    # H100 SXM 80GB: 989 TFLOP/s bf16; NVSwitch AllGather ~30 us, ~394 GB/s algbw (nccl-tests);
    # 400 Gb/s NDR IB per GPU; torch reports total_memory=81089MB (MiB) for 'NVIDIA H100 80GB HBM3'.
    "h100": DeviceSpec(name="h100", peak_flops=989e12, mfu=0.4, efficiency={"matmul": 0.53, "attention": 0.16},
                       memory_bytes=81089 * MiB, **GPU_HEADROOM, **GPU_HOST, comm_sm_share=H100_NCCL_SMS,
                       intra=Link(alpha_seconds=30e-6 / 7, bandwidth=394e9),
                       inter=Link(alpha_seconds=5e-6, bandwidth=45e9),
                       memory_bandwidth=3.35e12),
    # H200 SXM 141GB: the H100's GH100 die and clocks (989 TFLOP/s bf16, NVLink4, so the H100's
    # links and efficiencies: no public bf16 FSDP measurement on H200 was found; torchtitan's
    # H200 benchmark runs Float8), HBM3e at 4.8 TB/s; torch reports total_memory=143156MB (MiB).
    "h200": DeviceSpec(name="h200", peak_flops=989e12, mfu=0.4, efficiency={"matmul": 0.53, "attention": 0.16},
                       memory_bytes=143156 * MiB, **GPU_HEADROOM, **GPU_HOST, comm_sm_share=H100_NCCL_SMS,
                       intra=Link(alpha_seconds=30e-6 / 7, bandwidth=394e9),
                       inter=Link(alpha_seconds=5e-6, bandwidth=45e9),
                       memory_bandwidth=4.8e12),
}


@dataclass(frozen=True, kw_only=True)
class Cluster:
    world: int
    """Number of data-parallel workers."""
    gpus_per_node: int
    """Workers per node; must divide world."""
    device: DeviceSpec

    def __post_init__(self):
        if self.world < 1:
            raise ValueError(f"world must be >= 1, got {self.world}")
        if self.gpus_per_node < 1 or self.world % min(self.world, self.gpus_per_node):
            raise ValueError(f"gpus-per-node ({self.gpus_per_node}) must divide world ({self.world})")

    @property
    def nodes(self) -> int:
        return max(1, self.world // self.gpus_per_node)

    @property
    def local(self) -> int:
        """Workers per node actually used (world may be smaller than a node)."""
        return min(self.world, self.gpus_per_node)


# ---------------------------------------------------------------- cluster files

CLUSTER_FILE_VERSION = 1


def cluster_file_text(device: DeviceSpec, *, fit: dict | None = None) -> str:
    """A cluster file (`shardsched profile --out cluster.json`): the device spec
    fitted on a machine, plus how well the fit matched (`fit`: free-form errors)."""
    import json

    from shardsched._json import to_dict
    return json.dumps({"version": CLUSTER_FILE_VERSION, "device": to_dict(device), "fit": fit or {}}, indent=1)


def read_cluster_file(path: str) -> DeviceSpec:
    """The DeviceSpec a cluster file holds; UsageError (one line) on anything malformed."""
    import json

    from shardsched._json import from_dict
    from shardsched.errors import UsageError
    try:
        data = json.loads(open(path, encoding="utf-8").read())
        if not isinstance(data, dict) or data.get("version") != CLUSTER_FILE_VERSION:
            raise ValueError(f"no 'version': {CLUSTER_FILE_VERSION}")
        return from_dict(DeviceSpec, data["device"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise UsageError(f"--cluster {path}: not a cluster file from 'shardsched profile --out' ({e})") from None
