"""Train a ResNet with Keras 3 under tb_gpuprof's callback, with the seed article's knobs.

    python demo/keras_resnet.py --backend tensorflow --no-tf32 --logdir runs/k_fp32
    python demo/keras_resnet.py --backend tensorflow --tf32 --amp --logdir runs/k_amp
    python demo/keras_resnet.py --backend jax --amp --compile --logdir runs/k_jax_amp_xla
    python demo/keras_resnet.py --backend torch --amp --logdir runs/k_torch_amp
    tensorboard --logdir runs        # or: tb-gpuprof report runs/k_amp

Defaults: on a GPU, keras.applications.ResNet50 (weights=None) at 224 px, batch 256, window
[20, 24); on a CPU, a half-width ResNet-18 at 64 px, batch 16, window [5, 8). Synthetic data
unless ``--data DIR`` names an image folder (one sub-folder per class; read with
keras.utils.image_dataset_from_directory, which needs TensorFlow installed).
``--backend`` sets KERAS_BACKEND before keras is imported.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

# A checkout works without `pip install`: an installed tb_gpuprof still wins.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default=None,
                    help="Keras backend (default: $KERAS_BACKEND, else tensorflow)")
    ap.add_argument("--logdir", default="runs/keras_resnet", help="the run directory")
    ap.add_argument("--model", choices=("resnet18", "resnet50"), default=None,
                    help="default: resnet50 on a GPU, a half-width resnet18 on a CPU")
    ap.add_argument("--batch-size", type=int, default=None, help="GPU 256, CPU 16")
    ap.add_argument("--image-size", type=int, default=None, help="GPU 224, CPU 64")
    ap.add_argument("--num-classes", type=int, default=None)
    ap.add_argument("--tf32", action=argparse.BooleanOptionalAction, default=None,
                    help="TF32 for FP32 matmul/conv (default: the backend's default)")
    ap.add_argument("--amp", action="store_true", help="mixed precision policy")
    ap.add_argument("--amp-dtype", choices=("float16", "bfloat16"), default="float16",
                    help="mixed_float16 or mixed_bfloat16 on a GPU (a CPU uses bfloat16)")
    ap.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                    help="image data format (Keras' default is channels_last; "
                         "--no-channels-last makes it channels_first)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="jit_compile=True/False (default: Keras' 'auto')")
    ap.add_argument("--iterations", type=int, default=None,
                    help="training steps (default: iter-stop + 2)")
    ap.add_argument("--iter-start", type=int, default=None, help="first profiled step")
    ap.add_argument("--iter-stop", type=int, default=None,
                    help="step the profiled window stops before")
    ap.add_argument("--data", default=None, metavar="DIR",
                    help="image folder; default: synthetic images")
    return ap.parse_args(argv)


def gpu_present(backend: str) -> bool:
    if backend == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    if backend == "jax":
        import jax

        return jax.default_backend() == "gpu"
    import torch

    return torch.cuda.is_available()


def set_tf32(backend: str, on: bool) -> None:
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(on)
    elif backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if on else "highest")
    else:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def small_resnet(keras: Any, input_shape: tuple[int, int, int], classes: int,
                 width: int = 32) -> Any:
    """ResNet-18's layout (basic blocks 2-2-2-2) at ``width`` channels in the first stage."""
    layers = keras.layers
    axis = -1 if keras.config.image_data_format() == "channels_last" else 1

    def conv_bn(x: Any, filters: int, kernel: int, stride: int, relu: bool = True) -> Any:
        x = layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization(axis=axis)(x)
        return layers.ReLU()(x) if relu else x

    inputs = keras.Input(input_shape)
    x = conv_bn(inputs, width, 7, 2)
    x = layers.MaxPooling2D(3, 2, padding="same")(x)
    for stage in range(4):
        filters = width * 2 ** stage
        for i in range(2):
            stride = 2 if i == 0 and stage > 0 else 1
            shortcut = x if i > 0 or stage == 0 else conv_bn(x, filters, 1, stride, relu=False)
            y = conv_bn(x, filters, 3, stride)
            y = conv_bn(y, filters, 3, 1, relu=False)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes, dtype="float32")(x)  # logits in fp32 under mixed precision
    return keras.Model(inputs, outputs, name=f"resnet18_w{width}")


def synthetic_data(keras: Any, batch: int, size: int, classes: int, steps: int) -> Any:
    """``steps`` batches of the same random images (no downloads, no decode cost)."""
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (batch, size, size, 3) if keras.config.image_data_format() == "channels_last" \
        else (batch, 3, size, size)
    x = rng.standard_normal(shape, dtype=np.float32)
    y = rng.integers(0, classes, batch)

    class Repeat(keras.utils.PyDataset):
        def __len__(self) -> int:
            return steps

        def __getitem__(self, index: int) -> tuple[Any, Any]:
            return x, y

    return Repeat()


def folder_data(keras: Any, data: str, batch: int, size: int) -> tuple[Any, int]:
    if not os.path.isdir(data):
        sys.exit(f"keras_resnet.py: error: {data}: not a directory (--data wants an image "
                 "folder with one sub-folder per class)")
    try:
        ds = keras.utils.image_dataset_from_directory(data, image_size=(size, size),
                                                      batch_size=batch)
    except (ImportError, ValueError) as e:
        sys.exit(f"keras_resnet.py: error: {data}: cannot read it as an image folder "
                 f"(needs TensorFlow installed): {e}")
    return ds.repeat(), len(ds.class_names)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend  # must precede `import keras`
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import keras
    except ImportError:
        print("keras_resnet.py needs Keras 3: pip install keras tensorflow (or jax, torch)",
              file=sys.stderr)
        return 2
    from tb_gpuprof.analysis.format import render
    from tb_gpuprof.keras import GpuProfCallback

    backend = keras.backend.backend()
    gpu = gpu_present(backend)
    model_name = args.model or ("resnet50" if gpu else "resnet18")
    batch = args.batch_size or (256 if gpu else 16)
    size = args.image_size or (224 if gpu else 64)
    classes = args.num_classes or (1000 if gpu else 10)
    iter_start = args.iter_start if args.iter_start is not None else (20 if gpu else 5)
    iter_stop = args.iter_stop if args.iter_stop is not None else \
        (iter_start + 1 if args.iter_start is not None else (24 if gpu else 8))
    if iter_stop <= iter_start:
        sys.exit(f"keras_resnet.py: error: --iter-stop ({iter_stop}) must be greater than "
                 f"--iter-start ({iter_start})")
    steps = args.iterations if args.iterations is not None else iter_stop + 2

    if args.tf32 is not None:
        set_tf32(backend, args.tf32)
    if args.channels_last is not None:
        keras.config.set_image_data_format("channels_last" if args.channels_last
                                           else "channels_first")
    if args.amp:
        keras.mixed_precision.set_global_policy(
            f"mixed_{args.amp_dtype if gpu else 'bfloat16'}")

    if args.data:
        data, classes = folder_data(keras, args.data, batch, size)
    else:
        data = synthetic_data(keras, batch, size, classes, steps)
    shape = (size, size, 3) if keras.config.image_data_format() == "channels_last" \
        else (3, size, size)
    if model_name == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=shape, classes=classes,
                                            classifier_activation=None)
    else:
        model = small_resnet(keras, shape, classes)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile="auto" if args.compile is None else args.compile)
    print(f"{model.name} on {backend} ({'GPU' if gpu else 'CPU'}): batch {batch}, {size} px, "
          f"tf32={args.tf32}, policy={keras.mixed_precision.global_policy().name}, "
          f"{keras.config.image_data_format()}, jit_compile={model.jit_compile}, "
          f"{steps} steps, window [{iter_start}, {iter_stop})", flush=True)

    cb = GpuProfCallback(args.logdir, iter_start=iter_start, iter_stop=iter_stop)
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[cb], verbose=0)
    if cb.report is not None:
        sys.stdout.write(render(cb.report, fmt="text", top=5))
    times = sorted(cb.iteration_times_ms[1:] or cb.iteration_times_ms)
    median = f"{times[len(times) // 2]:.1f} ms" if times else "-"
    print(f"{args.logdir}: {steps} steps, median step {median}; "
          f"{'report stored' if cb.report is not None else 'no report (see the warnings)'}")
    print(f"view it: tensorboard --logdir {args.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
