"""Distributed-training rules: exposed communication and the process-group backend on one
rank's report, the straggler across ranks (docs/recommendations.md, docs/distributed.md)."""

from __future__ import annotations

import statistics
from typing import Any

from .build import recommendation as _rec
from .rule import Rule, RuleDoc, never, on_report

# Rules (docs/recommendations.md).
COMMUNICATION_MIN_EXPOSED_PCT = 10.0  # exposed communication, of wall time
COMMUNICATION_HIGH_EXPOSED_PCT = 30.0
COMMUNICATION_SAVING = 0.5  # share of exposed communication the fixes are assumed to hide
STRAGGLER_MIN_PCT = 10.0  # slowest rank's working time over the other ranks' median
STRAGGLER_MIN_MS = 1.0
STRAGGLER_HIGH_PCT = 25.0


COMMUNICATION_FIX = {
    "pytorch": "# larger gradient buckets: fewer, bigger all-reduces that overlap the backward\n"
               "model = DDP(model, bucket_cap_mb=100, gradient_as_bucket_view=True)\n"
               "# accumulate gradients locally and all-reduce every k-th step\n"
               "with model.no_sync():\n"
               "    loss_fn(model(x), y).backward()\n"
               "# FSDP: FSDP(model, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, "
               "forward_prefetch=True)",
    "keras": "# all-reduce in larger packs and with NCCL\n"
             "tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce("
             "num_packs=1))\n"
             "# and accumulate gradients over several steps (model.fit(..., steps_per_execution=k)"
             " with a larger global batch)",
    "jax": "# shard so collectives overlap compute (XLA async collectives), e.g.\n"
           "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true\n"
           "# and accumulate gradients over micro-batches before the psum",
}


def rule_communication(report: dict[str, Any]) -> dict[str, Any] | None:
    """Exposed (non-overlapped) communication is a large share of the iteration."""
    section = report.get("distributed")
    if not section or not section.get("communication_us"):
        return None
    share = section.get("exposed_pct") or 0.0
    if share < COMMUNICATION_MIN_EXPOSED_PCT:
        return None
    mean = section.get("mean_ms") or {}
    exposed = mean.get("exposed_ms") or 0.0
    return _rec("communication", "high" if share >= COMMUNICATION_HIGH_EXPOSED_PCT else "medium",
                "Hide gradient communication behind compute",
                f"{share}% of each iteration waits on collective communication that no compute "
                f"overlaps ({exposed:.2f} ms per iteration; {section.get('overlap_pct')}% of "
                "communication time is overlapped). Part of it can be waiting for a slower "
                "rank: the Distributed view compares the ranks.",
                {"exposed_pct": share, "exposed_ms_per_iteration": exposed,
                 "communication_pct": section.get("communication_pct"),
                 "overlap_pct": section.get("overlap_pct"),
                 "top_collectives": [c["name"] for c in section.get("collectives") or []][:3]},
                COMMUNICATION_FIX, round(exposed * COMMUNICATION_SAVING, 3),
                (report.get("iterations") or {}).get("mean_ms"),
                exposed)  # at best no collective is exposed


def _uses_nccl(backend: str) -> bool:
    # "nccl", or a per-device map such as "cpu:gloo,cuda:nccl"
    return "nccl" in backend.lower() or "rccl" in backend.lower()


DISTRIBUTED_BACKEND_FIX: dict[str, str] = {
    "pytorch": ("torch.distributed.init_process_group(backend=\"nccl\")\n"
                "# or keep gloo for CPU tensors: backend=\"cpu:gloo,cuda:nccl\""),
    "keras": ("tf.distribute.MultiWorkerMirroredStrategy(communication_options="
              "tf.distribute.experimental.CommunicationOptions(\n"
              "    implementation=tf.distribute.experimental."
              "CommunicationImplementation.NCCL))"),
    "jax": ("# JAX uses NCCL on GPUs; do not force a CPU collectives implementation "
            "(jax_cpu_collectives_implementation) for GPU arrays"),
}


def rule_distributed_backend(report: dict[str, Any]) -> dict[str, Any] | None:
    """Training on GPUs with a non-NCCL process group (gloo/MPI move tensors through the host)."""
    dist = (report.get("system") or {}).get("distributed") or {}
    backend, world = dist.get("backend"), dist.get("world_size")
    if not isinstance(backend, str) or not backend or _uses_nccl(backend):
        return None
    if not (isinstance(world, int) and world > 1) or not (report.get("gpu_time_us") or 0) > 0:
        return None  # CPU training: gloo is the right backend
    return _rec("distributed_backend", "high", "Use the NCCL backend for GPU training",
                f"The process group uses {backend!r} while the model trains on GPUs: "
                "collectives copy every gradient through host memory and run on the CPU "
                "instead of NVLink/InfiniBand with GPU-side reductions.",
                {"backend": backend, "world_size": world},
                DISTRIBUTED_BACKEND_FIX,
                None, None)


STRAGGLER_FIX: dict[str, str] = {
    "pytorch": ("# on the slow rank, check:\n"
                "# - its GPU's telemetry (GPU tab of its run: clocks, throttling)\n"
                "# - its input pipeline: DataLoader(num_workers=..., pin_memory=True)\n"
                "# - CPU contention: OMP_NUM_THREADS, numactl/taskset per rank\n"
                "# - even work: DistributedSampler, equal batch and sequence lengths "
                "(padding/bucketing)"),
    "keras": ("# on the slow worker, check its input pipeline (tf.data prefetch/AUTOTUNE),\n"
              "# its GPU telemetry and that the data shards are even"),
    "jax": ("# on the slow process, check its host input pipeline and GPU telemetry;\n"
            "# keep per-device batch shapes equal"),
}


def rule_straggler(summary: dict[str, Any]) -> dict[str, Any] | None:
    s = summary.get("straggler")
    if not s or not s["significant"]:
        return None
    rows = {r["rank"]: r for r in summary["ranks"]}
    slow = rows[s["rank"]]
    others = [r for r in summary["ranks"] if r is not slow]
    compute_gap = None
    if slow.get("compute_ms") is not None and all(r.get("compute_ms") is not None
                                                  for r in others):
        compute_gap = round(slow["compute_ms"]
                            - statistics.median(r["compute_ms"] for r in others), 4)
    where = ("its compute takes longer (uneven work, or a slower or throttled GPU)"
             if compute_gap is not None and compute_gap >= 0.5 * s["slower_by_ms"]
             else "the extra time is outside compute (input pipeline, host code, CPU "
                  "contention on that rank)")
    mean = statistics.fmean(r["iteration_ms"] for r in summary["ranks"])
    return _rec("straggler", "high" if s["slower_by_pct"] >= STRAGGLER_HIGH_PCT else "medium",
                f"Rank {s['rank']} is a straggler: the other ranks wait for it",
                f"Rank {s['rank']} works {s['slower_by_ms']:.2f} ms ({s['slower_by_pct']}%) "
                "longer per iteration than the median of the other ranks, which spend that "
                f"time waiting in collectives; {where}.",
                {"rank": s["rank"], "slower_by_ms": s["slower_by_ms"],
                 "slower_by_pct": s["slower_by_pct"], "compute_gap_ms": compute_gap,
                 "load_imbalance": summary.get("load_imbalance")},
                STRAGGLER_FIX, round(s["slower_by_ms"], 3), mean)


def _least_waiting_rank(summary: dict[str, Any], reports: list[dict[str, Any]]
                        ) -> dict[str, Any] | None:
    """Communication judged on the rank that waits least: the others' exposed time also holds
    their wait for the slowest rank, which bucket sizes do not fix."""
    with_comm = [r for r in reports if (r.get("distributed") or {}).get("communication_us")]
    if not with_comm:
        return None
    least = min(with_comm, key=lambda r: r["distributed"].get("exposed_pct") or 0.0)
    return rule_communication(least)


def _any_rank_backend(summary: dict[str, Any], reports: list[dict[str, Any]]
                      ) -> dict[str, Any] | None:
    return next((rec for r in reports if (rec := rule_distributed_backend(r)) is not None),
                None)


STRAGGLER_DOC = RuleDoc(
    fires=("the rank with the largest working time (iteration − exposed communication) exceeds "
           "the median of the other ranks by ≥ 10% and ≥ 1 ms"),
    silent="one rank only, or below either bound",
    estimate=("the excess working time (what the other ranks wait); severity high at ≥ 25%, "
              "else medium"),
    bound="–",
    reads="every rank's report",
)


COMMUNICATION_DOC = RuleDoc(
    fires="exposed (non-overlapped) communication ≥ 10% of wall time",
    silent="no communication measured, or below 10%",
    estimate=("half the exposed communication per iteration; severity high at ≥ 30%, else "
              "medium"),
    bound="the exposed communication",
    reads="one rank's trace; every rank's (the rank that waits least)",
)

DISTRIBUTED_BACKEND_DOC = RuleDoc(
    fires=("world size > 1, the backend is not NCCL (`gloo`, `mpi`, …; a per-device map like "
           "`cpu:gloo,cuda:nccl` counts as NCCL) **and** the window holds GPU work"),
    silent="CPU training (no GPU time: gloo is right there), single process, backend unknown",
    estimate="not estimated; severity high",
    bound="–",
    reads="one rank's process group; every rank's",
)

# the straggler comes first: the order is the tie-break among equal savings and severities
RULES: tuple[Rule, ...] = (
    Rule("straggler", never, STRAGGLER_DOC, STRAGGLER_FIX,
         not_verifiable="a rank's slowness is its machine's or its data's, not a setting",
         needs_gpu=False, across_ranks=lambda summary, reports: rule_straggler(summary)),
    Rule("communication", on_report(rule_communication), COMMUNICATION_DOC, COMMUNICATION_FIX,
         not_verifiable="bucket sizes and gradient accumulation are fixed when DDP/FSDP wraps "
                        "the model",
         needs_gpu=False, across_ranks=_least_waiting_rank),
    Rule("distributed_backend", on_report(rule_distributed_backend), DISTRIBUTED_BACKEND_DOC,
         DISTRIBUTED_BACKEND_FIX,
         not_verifiable="the process group's backend is chosen once, at init_process_group",
         needs_gpu=False, across_ranks=_any_rank_backend),
)
