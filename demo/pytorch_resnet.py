"""Train a ResNet under tb_gpuprof's PyTorch hook, with the seed article's knobs.

    python demo/pytorch_resnet.py --no-tf32 --logdir runs/r50_fp32             # FP32
    python demo/pytorch_resnet.py --tf32 --logdir runs/r50_tf32                # + TF32
    python demo/pytorch_resnet.py --tf32 --amp --logdir runs/r50_amp           # + AMP fp16
    python demo/pytorch_resnet.py --tf32 --amp --channels-last --logdir runs/r50_amp_cl
    tensorboard --logdir runs        # or: tb-gpuprof report runs/r50_fp32

Defaults: on a GPU, torchvision's ResNet-50 (or the same architecture built in, without
torchvision) at 224 px, batch 256, window [20, 24); on a CPU, a half-width ResNet-18 at 64 px,
batch 16, window [10, 13), which finishes in well under a minute. Synthetic data unless
``--data DIR`` names an image folder (one sub-folder per class; needs torchvision).
The training loop itself is ``tb_gpuprof.demo.train`` (shared with ``tb-gpuprof demo``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

# A checkout works without `pip install`: an installed tb_gpuprof still wins.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logdir", default="runs/pytorch_resnet", help="the run directory")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default: cuda when a GPU is present")
    ap.add_argument("--model", choices=("resnet18", "resnet34", "resnet50"), default=None,
                    help="default: resnet50 on a GPU, resnet18 on a CPU")
    ap.add_argument("--width", type=int, default=None,
                    help="channels of the first stage (64 = torchvision; CPU default 32)")
    ap.add_argument("--batch-size", type=int, default=None, help="GPU 256, CPU 16")
    ap.add_argument("--image-size", type=int, default=None, help="GPU 224, CPU 64")
    ap.add_argument("--num-classes", type=int, default=None)
    ap.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None,
                    help="TF32 Tensor Cores for FP32 matmul/conv (default: PyTorch's defaults)")
    ap.add_argument("--amp", action="store_true", help="automatic mixed precision")
    ap.add_argument("--amp-dtype", choices=("float16", "bfloat16"), default="float16",
                    help="autocast dtype on a GPU (a CPU always uses bfloat16)")
    ap.add_argument("--channels-last", action="store_true",
                    help="channels_last (NHWC) memory format for the model and the input")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--iterations", type=int, default=None,
                    help="iterations to train (default: iter-stop + 2)")
    ap.add_argument("--iter-start", type=int, default=None, help="first profiled iteration")
    ap.add_argument("--iter-stop", type=int, default=None,
                    help="iteration the profiled window stops before")
    ap.add_argument("--data", default=None, metavar="DIR",
                    help="image folder (torchvision ImageFolder); default: synthetic images")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers with --data")
    return ap.parse_args(argv)


def config_from_args(args: argparse.Namespace, device: str):  # -> TrainConfig
    from tb_gpuprof.demo import default_config

    cfg = default_config(device)
    changes = {k: v for k, v in {
        "model": args.model, "width": args.width, "batch_size": args.batch_size,
        "image_size": args.image_size, "num_classes": args.num_classes,
        "iter_start": args.iter_start, "iter_stop": args.iter_stop, "tf32": args.tf32,
        "data": args.data}.items() if v is not None}
    if args.model is not None and args.width is None:
        changes["width"] = 64 if device == "cuda" or args.model == "resnet50" else cfg.width
    cfg = dataclasses.replace(cfg, amp=args.amp, amp_dtype=args.amp_dtype,
                              channels_last=args.channels_last, compile=args.compile,
                              workers=args.workers, **changes)
    if args.iter_start is not None and args.iter_stop is None:
        cfg = dataclasses.replace(cfg, iter_stop=cfg.iter_start + 1)
    if cfg.iter_stop <= cfg.iter_start:
        raise SystemExit(f"--iter-stop ({cfg.iter_stop}) must be greater than --iter-start "
                         f"({cfg.iter_start})")
    iterations = args.iterations if args.iterations is not None else cfg.iter_stop + 2
    return dataclasses.replace(cfg, iterations=iterations)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("pytorch_resnet.py needs PyTorch: pip install torch", file=sys.stderr)
        return 2
    from tb_gpuprof.analysis.format import render
    from tb_gpuprof.demo import detect_device, summarize, train
    from tb_gpuprof.errors import GpuProfError

    device = args.device or detect_device()
    try:
        cfg = config_from_args(args, device)
        print(f"{cfg.model} (width {cfg.width}) on {device}: batch {cfg.batch_size}, "
              f"{cfg.image_size} px, tf32={cfg.tf32}, amp={cfg.amp and cfg.amp_dtype}, "
              f"channels_last={cfg.channels_last}, compile={cfg.compile}, "
              f"{cfg.iterations} iterations, window [{cfg.iter_start}, {cfg.iter_stop})",
              flush=True)
        result = train(cfg, args.logdir)
    except GpuProfError as e:
        print(f"pytorch_resnet.py: error: {e}", file=sys.stderr)
        return 2
    if result["report"] is not None:
        sys.stdout.write(render(result["report"], fmt="text", top=5))
    print(f"{args.logdir}: {summarize(result)}")
    print(f"view it: tensorboard --logdir {args.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
