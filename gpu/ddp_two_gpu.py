"""DDP ResNet-50 on several GPUs of one host through the PyTorch hook: the distributed view.

One process per GPU (torchrun), NCCL, synthetic ImageNet-shaped data, AMP bf16 +
channels_last; every rank profiles the same window with GpuProfiler into one log directory
(rank 0 -> <out>/runs/ddp_resnet50, rank r -> <out>/runs/ddp_resnet50/rank<r>); rank 0 also
records the NVLink topology. At the end rank 0 reads every rank's stored report, runs the
cross-rank analysis (the plugin's /distributed answer) and prints and writes it to
<out>/ddp_summary.json.

NVLink multicast (NVLS) must stay off on shared machines: this script forces
NCCL_NVLS_ENABLE=0 (and PyTorch's/NVSHMEM's multicast switches) before NCCL starts; keep them
in the launching environment too.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
      torchrun --standalone --nproc-per-node 2 gpu/ddp_two_gpu.py --out $OUT/ddp
    # a slowed rank (real sleep per iteration on the last rank): the straggler
    ... gpu/ddp_two_gpu.py --out $OUT/ddp_straggler --straggler-ms 20
    # gloo on GPUs: the distributed_backend recommendation
    ... gpu/ddp_two_gpu.py --out $OUT/ddp_gloo --backend gloo
    # CPU smoke test (gloo, tiny model): torchrun --nproc-per-node 2 gpu/ddp_two_gpu.py \\
    #     --out /tmp/ddp --device cpu --tiny
"""

from __future__ import annotations

import os

# Before torch/NCCL read them: multicast stays off whatever the caller's environment says.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tb_gpuprof.torch import GpuProfiler

RUN = "ddp_resnet50"


def build_model(tiny: bool) -> torch.nn.Module:
    if tiny:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
    import torchvision

    return torchvision.models.resnet50()


def record_topology(run_dir: str, world_size: int) -> None:
    """NVML topology of the GPUs the job uses (rank 0, one host), before the hook's writer."""
    from tb_gpuprof.nvml.topology import format_matrix, topology
    from tb_gpuprof.store.schema import TOPOLOGY_TAG
    from tb_gpuprof.store.writer import EventWriter

    try:
        topo = topology(list(range(world_size)))
    except Exception as e:  # no NVML: the run goes on without a topology
        print(f"topology not recorded: {e}", flush=True)
        return
    with EventWriter(run_dir, filename_suffix=".topology") as w:
        w.add_json(TOPOLOGY_TAG, topo, 0)
    print(format_matrix(topo), flush=True)


def summarize(logdir: str, world_size: int) -> dict:
    """Every rank's stored report -> the cross-rank analysis (what /distributed answers)."""
    from tb_gpuprof.analysis.distributed import cross_rank_summary
    from tb_gpuprof.store import schema
    from tb_gpuprof.store.reader import stored_reports

    reports = []
    for rank in range(world_size):
        run_dir = os.path.join(logdir, RUN, *([f"rank{rank}"] if rank else []))
        stored = stored_reports(run_dir)
        if not stored:
            print(f"rank {rank}: no report in {run_dir}", flush=True)
            continue
        latest = max(stored, key=lambda s: (s.step, s.wall_time))
        reports.append(schema.decode_report(latest.blob, latest.content, run_dir))
    return cross_rank_summary(reports)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--backend", default=None, help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--batch", type=int, default=128, help="per GPU")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--window", type=int, nargs=2, default=(30, 35),
                    help="iter_start iter_stop of the profiled window")
    ap.add_argument("--straggler-ms", type=float, default=0.0,
                    help="sleep this long per iteration on the last rank")
    ap.add_argument("--tiny", action="store_true", help="small model and images (smoke test)")
    args = ap.parse_args()

    cuda = args.device == "cuda"
    backend = args.backend or ("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)  # before the hook: it profiles and samples this GPU
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    logdir = os.path.join(args.out, "runs")
    if rank == 0 and cuda:
        record_topology(os.path.join(logdir, RUN), world)

    torch.manual_seed(rank)
    torch.backends.cudnn.benchmark = True
    model = build_model(args.tiny).to(device)
    image = 32 if args.tiny else 224
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    model = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(args.batch, 3, image, image, device=device)
    if cuda:
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 10 if args.tiny else 1000, (args.batch,), device=device)
    slow = args.straggler_ms > 0 and rank == world - 1

    t0 = time.perf_counter()
    with GpuProfiler(logdir + os.sep + RUN, iter_start=args.window[0],
                     iter_stop=args.window[1], model=model) as prof:
        for _ in range(args.iters):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if slow:
                time.sleep(args.straggler_ms / 1e3)
            prof.step()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(f"rank {rank}/{world} ({backend}): {args.iters} iterations in {elapsed:.2f} s; "
          f"window analysis {prof.analysis_seconds or 0:.2f} s; report "
          f"{'stored' if prof.report else 'MISSING'}", flush=True)
    dist.barrier()  # every rank's report is stored before rank 0 reads them
    if rank == 0:
        summary = summarize(logdir, world)
        with open(os.path.join(args.out, "ddp_summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        for r in summary["ranks"]:
            print(f"rank {r['rank']}: iteration {r['iteration_ms']:.2f} ms, working "
                  f"{r['working_ms']:.2f} ms, compute {r['compute_ms']} ms, communication "
                  f"{r['communication_ms']} ms, overlapped {r['overlap_pct']}%, exposed "
                  f"{r['exposed_ms']} ms", flush=True)
        print(f"straggler: {summary['straggler']}; load imbalance {summary['load_imbalance']}; "
              f"recommendations: {[r['id'] for r in summary['recommendations']]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
