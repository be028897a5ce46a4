"""Record real training loops that are *not* the textbook GPU-bound ResNet (run on the H200).

Each case trains for a while through one of our hooks (torch GpuProfiler, the Lightning
callback, the Keras callback on JAX) with a 3-iteration window, and before that times the same
loop without any hook (synchronized at both ends, total / N), so the report's un-profiled
iteration time can be checked against the truth. One process per case: CUPTI allows one
subscriber, and JAX and torch.profiler must not share a process.

    python3 gpu/diagnosis_cases.py --out $OUT/cases            # every case, one process each
    python3 gpu/diagnosis_cases.py --out /tmp/c --case numpy_prep --smoke   # CPU smoke test

Writes <out>/<case>/ (the hook's run: events file + stored window trace) and
<out>/<case>.meta.json (what the loop was, the un-profiled time, the hook's always-on times).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TORCH_CASES = ["numpy_prep", "tokenize", "pageable", "pinned", "slow_loader", "gpt2_eager",
               "host_sync", "lightning_auto", "resnet50_fp32", "resnet50_tf32", "resnet50_amp",
               "resnet50_amp_cl", "gpt2_tf32", "gpt2_bf16_compile"]
OTHER_CASES = ["keras_jax_small", "jax_host_prep", "jax_lm_fp32", "jax_lm_tf32", "jax_lm_bf16"]
LADDER_CASES = ["gpt2_tf32", "gpt2_eager", "gpt2_bf16_compile", "jax_lm_fp32", "jax_lm_tf32",
                "jax_lm_bf16"]
WINDOW = (12, 15)
ITERS = 30
TIMED = 12


def _meta_path(out: str, case: str) -> str:
    return os.path.join(out, f"{case}.meta.json")


def _write_meta(out: str, case: str, meta: dict[str, Any]) -> None:
    with open(_meta_path(out, case), "w") as f:
        json.dump(meta, f, indent=1)


# --------------------------------------------------------------------------- torch cases


def _torch_setup(smoke: bool):
    import torch

    dev = torch.device("cpu" if smoke else "cuda")
    torch.backends.cudnn.benchmark = not smoke
    return torch, dev


def _sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _time_loop(torch: Any, dev: Any, step: Callable[[], None], n: int) -> float:
    """Mean iteration time of ``n`` steps without any hook (synchronized at both ends only)."""
    _sync(torch, dev)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    _sync(torch, dev)
    return (time.perf_counter() - t0) * 1e3 / n


def _hooked_loop(torch: Any, dev: Any, run: str, step: Callable[[], None], model: Any,
                 iters: int, with_stack: bool = False) -> dict[str, Any]:
    from tb_gpuprof.torch import GpuProfiler

    prof = GpuProfiler(run, iter_start=WINDOW[0], iter_stop=WINDOW[1], model=model,
                       with_stack=with_stack)
    t0 = time.perf_counter()
    with prof:
        for _ in range(iters):
            step()
            prof.step()
    _sync(torch, dev)
    return {"hook_wall_ms": list(getattr(prof, "_wall_ms", [])),
            "hook_total_s": time.perf_counter() - t0,
            "report_recommendations": [r["id"] for r in (prof.report or {}).get(
                "recommendations", [])]}


def _classifier_step(torch: Any, dev: Any, model: Any, batch_fn: Callable[[], tuple],
                     *, amp: Any = None, channels_last: bool = False, lr: float = 0.01,
                     ) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scaler = torch.amp.GradScaler(dev.type, enabled=amp is torch.float16 and dev.type == "cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        x, y = batch_fn()
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step


def case_numpy_prep(smoke: bool) -> tuple[Any, Callable[[], None], dict[str, Any]]:
    """ResNet-34 bf16; each batch decoded/augmented on the host with PIL + numpy, no DataLoader."""
    import numpy as np
    import torchvision
    from PIL import Image

    torch, dev = _torch_setup(smoke)
    batch, size = (4, 64) if smoke else (96, 224)
    rng = np.random.default_rng(0)
    raw = [rng.integers(0, 255, (size + 32, size + 32, 3), dtype=np.uint8) for _ in range(16)]
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    model = torchvision.models.resnet34(num_classes=1000).to(dev)

    def batch_fn() -> tuple:
        imgs = []
        for i in range(batch):
            img = Image.fromarray(raw[i % len(raw)]).resize((size, size), Image.BILINEAR)
            a = np.asarray(img, np.float32) / 255.0
            if rng.random() < 0.5:
                a = a[:, ::-1]
            imgs.append((a - mean) / std)
        x = torch.from_numpy(np.ascontiguousarray(np.stack(imgs).transpose(0, 3, 1, 2)))
        y = torch.from_numpy(rng.integers(0, 1000, batch))
        return x.to(dev), y.to(dev)

    step = _classifier_step(torch, dev, model, batch_fn, amp=torch.bfloat16)
    return model, step, {"model": "resnet34", "batch": batch, "autocast": "bfloat16",
                         "what": "PIL resize + numpy normalize per sample in the loop"}


def _make_tokenizer(tmp: str, corpus: list[str]) -> Any:
    """A slow (pure Python) GPT-2 tokenizer over a BPE vocabulary trained here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=8000, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.model.save(tmp)
    return GPT2Tokenizer(os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt"))


def _random_text(rng: Any, words: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(letters[j] for j in rng.integers(0, 26, rng.integers(2, 10)))
                    for _ in range(words))


def _gpt2(torch: Any, dev: Any, layers: int, d: int, heads: int, ctx: int, vocab: int) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=ctx, vocab_size=vocab)
    return GPT2LMHeadModel(cfg).to(dev)


def _lm_step(torch: Any, dev: Any, model: Any, batch_fn: Callable[[], Any],
             amp: Any) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        ids = batch_fn()
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def case_tokenize(smoke: bool) -> tuple[Any, Callable[[], None], dict[str, Any]]:
    """GPT-2 (6 layers) bf16; every batch of raw text tokenized in the loop (slow tokenizer)."""
    import tempfile

    import numpy as np

    torch, dev = _torch_setup(smoke)
    rng = np.random.default_rng(1)
    batch, seq, words = (2, 32, 40) if smoke else (16, 256, 400)
    corpus = [_random_text(rng, 200) for _ in range(200)]
    tok = _make_tokenizer(tempfile.mkdtemp(prefix="tok_"), corpus)
    model = _gpt2(torch, dev, 2 if smoke else 6, 128 if smoke else 512, 8, seq, len(tok))

    def batch_fn() -> Any:
        texts = [_random_text(rng, words) for _ in range(batch)]
        enc = [tok.encode(t)[:seq] for t in texts]
        enc = [e + [0] * (seq - len(e)) for e in enc]
        return torch.tensor(enc, dtype=torch.long).to(dev)

    step = _lm_step(torch, dev, model, batch_fn, torch.bfloat16)
    return model, step, {"model": "gpt2-6L-512", "batch": batch, "seq": seq,
                         "autocast": "bfloat16", "what": "slow GPT2Tokenizer per batch in loop"}


def _mlp(torch: Any, d_in: int, hidden: int, layers: int, out: int) -> Any:
    nn = torch.nn
    mods: list[Any] = []
    d = d_in
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), nn.GELU()]
        d = hidden
    mods.append(nn.Linear(d, out))
    return nn.Sequential(*mods)


def _copy_case(smoke: bool, pinned: bool) -> tuple[Any, Callable[[], None], dict[str, Any]]:
    torch, dev = _torch_setup(smoke)
    batch, d = (64, 256) if smoke else (8192, 8192)
    model = _mlp(torch, d, 256 if smoke else 4096, 2, 1000).to(dev)
    host = [torch.randn(batch, d) for _ in range(2)]
    labels = torch.randint(0, 1000, (batch,))
    if pinned and dev.type == "cuda":
        host = [h.pin_memory() for h in host]
        labels = labels.pin_memory()
    k = [0]

    def batch_fn() -> tuple:
        k[0] += 1
        x = host[k[0] % 2]
        return x.to(dev, non_blocking=pinned), labels.to(dev, non_blocking=pinned)

    step = _classifier_step(torch, dev, model, batch_fn, amp=torch.bfloat16)
    return model, step, {"model": f"mlp {d}-4096-4096-1000", "batch": batch,
                         "autocast": "bfloat16", "pinned": pinned,
                         "what": f"{batch}x{d} fp32 input copied each iteration from "
                                 f"{'pinned' if pinned else 'pageable'} memory"}


def case_pageable(smoke: bool):
    return _copy_case(smoke, pinned=False)


def case_pinned(smoke: bool):
    return _copy_case(smoke, pinned=True)


class _SlowImages:
    """A map-style dataset whose samples cost CPU time to make (decode + augmentation)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import numpy as np
        import torch
        from PIL import Image, ImageFilter

        rng = np.random.default_rng(i)
        img = Image.fromarray(rng.integers(0, 255, (self.size + 64, self.size + 64, 3),
                                           dtype=np.uint8))
        img = img.filter(ImageFilter.GaussianBlur(2)).resize((self.size, self.size))
        a = np.asarray(img, np.float32).transpose(2, 0, 1) / 255.0
        return torch.from_numpy(a.copy()), i % 1000


def case_slow_loader(smoke: bool):
    """timm ViT-S/16 bf16 fed by a 2-worker DataLoader whose samples are slow to make."""
    import timm

    torch, dev = _torch_setup(smoke)
    batch, size = (4, 32) if smoke else (128, 224)
    model = timm.create_model("vit_small_patch16_224" if not smoke else "resnet10t",
                              num_classes=1000, img_size=size) if not smoke else \
        timm.create_model("resnet10t", num_classes=1000)
    model = model.to(dev)
    loader = torch.utils.data.DataLoader(_SlowImages(10**6, size), batch_size=batch,
                                         num_workers=2, pin_memory=dev.type == "cuda",
                                         persistent_workers=True)
    it = iter(loader)

    def batch_fn() -> tuple:
        x, y = next(it)
        return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    step = _classifier_step(torch, dev, model, batch_fn, amp=torch.bfloat16)
    return model, step, {"model": "timm vit_small_patch16_224", "batch": batch,
                         "autocast": "bfloat16", "what": "DataLoader(num_workers=2), slow "
                                                         "PIL blur+resize per sample"}


def case_gpt2_eager(smoke: bool):
    """HF GPT-2 124M, bf16 autocast, eager, batch 4 x 256: launch-bound."""
    torch, dev = _torch_setup(smoke)
    batch, seq = (2, 32) if smoke else (4, 256)
    model = _gpt2(torch, dev, 2 if smoke else 12, 128 if smoke else 768, 4 if smoke else 12,
                  seq, 50257 if not smoke else 1000)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=dev)
    step = _lm_step(torch, dev, model, lambda: ids, torch.bfloat16)
    return model, step, {"model": "gpt2 124M (HF)", "batch": batch, "seq": seq,
                         "autocast": "bfloat16", "what": "eager, small batch"}


def case_gpt2_tf32(smoke: bool):
    """The launch-bound GPT-2 before AMP: FP32 weights, TF32 matmuls."""
    torch, dev = _torch_setup(smoke)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    batch, seq = (2, 32) if smoke else (4, 256)
    model = _gpt2(torch, dev, 2 if smoke else 12, 128 if smoke else 768, 4 if smoke else 12,
                  seq, 50257 if not smoke else 1000)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=dev)
    step = _lm_step(torch, dev, model, lambda: ids, None)
    return model, step, {"model": "gpt2 124M (HF)", "batch": batch, "seq": seq,
                         "autocast": None, "tf32": True, "what": "eager, small batch, TF32"}


def case_gpt2_bf16_compile(smoke: bool):
    """The launch-bound GPT-2 in bf16 after torch.compile (the compile rung)."""
    torch, dev = _torch_setup(smoke)
    batch, seq = (2, 32) if smoke else (4, 256)
    model = _gpt2(torch, dev, 2 if smoke else 12, 128 if smoke else 768, 4 if smoke else 12,
                  seq, 50257 if not smoke else 1000)
    compiled = torch.compile(model)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=dev)
    step = _lm_step(torch, dev, compiled, lambda: ids, torch.bfloat16)
    return model, step, {"model": "gpt2 124M (HF), torch.compile", "batch": batch, "seq": seq,
                         "autocast": "bfloat16", "compiled": True, "what": "compiled"}


def case_host_sync(smoke: bool):
    """bf16 MLP that reads loss.item() and eight gradient norms every step."""
    torch, dev = _torch_setup(smoke)
    batch, d = (16, 64) if smoke else (512, 2048)
    model = _mlp(torch, d, d, 8, 1000).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, d, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()
    log: list[float] = []

    def step() -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        log.append(loss.item())
        params = [p for p in model.parameters() if p.grad is not None]
        for p in params[:8]:
            log.append(float(p.grad.norm()))
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step, {"model": f"mlp 8x{d}", "batch": batch, "autocast": "bfloat16",
                         "what": "loss.item() + 8 grad norms float() per step"}


def _resnet50(smoke: bool, fp32: bool, tf32: bool, amp: bool, cl: bool):
    import torchvision

    torch, dev = _torch_setup(smoke)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    batch, size = (2, 64) if smoke else (128, 224)
    model = torchvision.models.resnet50().to(dev)
    if cl:
        model = model.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)
    step = _classifier_step(torch, dev, model, lambda: (x, y),
                            amp=torch.float16 if amp else None, channels_last=cl)
    return model, step, {"model": "resnet50", "batch": batch, "tf32": tf32,
                         "autocast": "float16" if amp else None, "channels_last": cl}


def case_resnet50_fp32(smoke: bool):
    return _resnet50(smoke, True, False, False, False)


def case_resnet50_tf32(smoke: bool):
    return _resnet50(smoke, False, True, False, False)


def case_resnet50_amp(smoke: bool):
    return _resnet50(smoke, False, True, True, False)


def case_resnet50_amp_cl(smoke: bool):
    return _resnet50(smoke, False, True, True, True)


def run_torch_case(case: str, out: str, smoke: bool) -> dict[str, Any]:
    model, step, meta = globals()[f"case_{case}"](smoke)
    torch, dev = _torch_setup(smoke)
    for _ in range(3 if smoke else 6):
        step()
    timed = 3 if smoke else TIMED
    meta["unprofiled_mean_ms"] = round(_time_loop(torch, dev, step, timed), 3)
    meta["unprofiled_iterations"] = timed
    meta.update(_hooked_loop(torch, dev, os.path.join(out, case), step, model,
                             ITERS if not smoke else WINDOW[1] + 3,
                             with_stack=case == "host_sync"))
    meta["unprofiled_after_mean_ms"] = round(_time_loop(torch, dev, step, timed), 3)
    return meta


def run_lightning_auto(out: str, smoke: bool) -> dict[str, Any]:
    """Lightning automatic optimisation (forward/backward inside optimizer.step(closure))."""
    import lightning as L
    import torch
    import torchvision

    from tb_gpuprof.lightning import GpuProfCallback

    batch, size = (2, 32) if smoke else (96, 224)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torchvision.models.resnet34()

        def training_step(self, b: Any, i: int) -> Any:
            x, y = b
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    n = 64 if not smoke else 24
    ds = torch.utils.data.TensorDataset(torch.randn(batch * 4, 3, size, size),
                                        torch.randint(0, 1000, (batch * 4,)))
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=0, pin_memory=True)

    def trainer(cb: list[Any], steps: int) -> Any:
        return L.Trainer(max_steps=steps, accelerator="cpu" if smoke else "gpu", devices=1,
                         precision="bf16-mixed" if not smoke else "32-true",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=cb)

    module = Module()
    t0 = time.perf_counter()
    trainer([], 8).fit(module, loader)
    t1 = time.perf_counter()
    trainer([], 8 + n // 2).fit(module, loader)
    plain = (time.perf_counter() - t1 - (t1 - t0)) * 1e3 / (n // 2)
    cb = GpuProfCallback(os.path.join(out, "lightning_auto"), WINDOW[0], WINDOW[1])
    trainer([cb], ITERS if not smoke else WINDOW[1] + 3).fit(module, loader)
    prof = cb.last_profiler
    return {"model": "resnet34 (Lightning, automatic optimisation)", "batch": batch,
            "precision": "bf16-mixed", "unprofiled_mean_ms": round(plain, 3),
            "unprofiled_note": "difference of two fits (8 and 8+n/2 steps) over n/2",
            "hook_wall_ms": list(getattr(prof, "_wall_ms", [])) if prof else None,
            "report_recommendations": [r["id"] for r in ((prof.report if prof else None)
                                                         or {}).get("recommendations", [])]}


# --------------------------------------------------------------------------- JAX cases


def run_keras_jax_small(out: str, smoke: bool) -> dict[str, Any]:
    """Keras 3 on JAX: a small MLP at batch 32, one step per execution (low GPU use)."""
    os.environ["KERAS_BACKEND"] = "jax"
    import keras
    import numpy as np

    from tb_gpuprof.keras import GpuProfCallback

    n_steps = ITERS if not smoke else WINDOW[1] + 3
    batch = 32
    x = np.random.rand(batch * (n_steps + 40), 784).astype("float32")
    y = np.random.randint(0, 10, len(x))
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:batch * 20], y[:batch * 20], batch_size=batch, epochs=1, verbose=0)
    t0 = time.perf_counter()
    model.fit(x[:batch * 20], y[:batch * 20], batch_size=batch, epochs=1, verbose=0)
    plain = (time.perf_counter() - t0) * 1e3 / 20
    cb = GpuProfCallback(os.path.join(out, "keras_jax_small"), WINDOW[0], WINDOW[1])
    model.fit(x[:batch * n_steps], y[:batch * n_steps], batch_size=batch, epochs=1, verbose=0,
              callbacks=[cb])
    cb.wait() if hasattr(cb, "wait") else None
    return {"model": "keras MLP 784-512-512-10 on JAX", "batch": batch,
            "unprofiled_mean_ms": round(plain, 3),
            "hook_wall_ms": list(getattr(cb, "_wall_ms", [])),
            "report_recommendations": [r["id"] for r in (cb.report or {}).get(
                "recommendations", [])]}


def run_jax_host_prep(out: str, smoke: bool) -> dict[str, Any]:
    """A jitted JAX MLP step whose batches are made with numpy on the host (jax.profiler)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    d, batch = 1024, 256
    params = [jnp.asarray(rng.standard_normal((d, d), np.float32) * 0.02) for _ in range(4)]

    @jax.jit
    def step(params, x):
        def loss(ps):
            h = x
            for w in ps:
                h = jax.nn.relu(h @ w)
            return jnp.mean(h * h)

        g = jax.grad(loss)(params)
        return [p - 1e-3 * gi for p, gi in zip(params, g, strict=True)]

    def make_batch():
        a = rng.standard_normal((batch, d)).astype(np.float32)
        for _ in range(30):  # host-side feature engineering in numpy
            a = np.tanh(a * 1.01 + 0.01)
        return jnp.asarray(a)

    for _ in range(3):
        params = step(params, make_batch())
    jax.block_until_ready(params)
    t0 = time.perf_counter()
    for _ in range(TIMED):
        params = step(params, make_batch())
    jax.block_until_ready(params)
    plain = (time.perf_counter() - t0) * 1e3 / TIMED
    trace_dir = os.path.join(out, "jax_host_prep_trace")
    jax.profiler.start_trace(trace_dir)
    for s in range(5):
        with jax.profiler.StepTraceAnnotation("train", step_num=s):
            params = step(params, make_batch())
    jax.block_until_ready(params)
    jax.profiler.stop_trace()
    return {"model": "jax MLP 4x1024", "batch": batch, "unprofiled_mean_ms": round(plain, 3),
            "what": "numpy tanh x30 per batch on the host", "trace_dir": trace_dir}


def jax_lm(smoke: bool, precision: str, rng: Any = None) -> tuple[Any, Any, dict[str, Any]]:
    """A jitted JAX MLP language model (embedding, 8 blocks of d=1024, ffn 4096, tied head),
    batch 8 x 512 tokens, in ``precision``: fp32 (matmul precision highest; call the step
    inside ``jax.default_matmul_precision(matmul_precision(precision))``), tf32, bf16.
    Returns (initial params, jitted SGD step, what the loop is)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    d, ffn, layers, vocab, batch, seq = (64, 128, 2, 256, 2, 16) if smoke else \
        (1024, 4096, 8, 8192, 8, 512)
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
    rng = rng if rng is not None else np.random.default_rng(0)

    def init(shape: tuple[int, ...]) -> Any:
        return jnp.asarray(rng.standard_normal(shape, np.float32) * 0.02)

    params = {"emb": init((vocab, d)),
              "blocks": [(init((d, ffn)), init((ffn, d))) for _ in range(layers)]}
    ids = jnp.asarray(rng.integers(0, vocab, (batch, seq)))

    def loss_fn(p: Any) -> Any:
        cast = jax.tree.map(lambda a: a.astype(dtype), p)
        h = cast["emb"][ids]
        for w1, w2 in cast["blocks"]:
            z = h.astype(jnp.float32)
            z = (z - z.mean(-1, keepdims=True)) * jax.lax.rsqrt(z.var(-1, keepdims=True) + 1e-5)
            h = h + jax.nn.gelu(z.astype(dtype) @ w1) @ w2
        logits = (h @ cast["emb"].T).astype(jnp.float32)
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    @jax.jit
    def step(p: Any) -> Any:
        g = jax.grad(loss_fn)(p)
        return jax.tree.map(lambda a, b: a - 1e-4 * b, p, g)

    return params, step, {"model": f"jax MLP LM {layers}x{d}", "batch": batch, "seq": seq,
                          "precision": precision}


def matmul_precision(precision: str) -> str:
    return "highest" if precision == "fp32" else "default"


def run_jax_lm(out: str, smoke: bool, precision: str) -> dict[str, Any]:
    """The JAX LM of :func:`jax_lm`, timed without a profiler, then a jax.profiler trace."""
    import jax

    params, step, meta = jax_lm(smoke, precision)
    ctx = jax.default_matmul_precision(matmul_precision(precision))
    with ctx:
        for _ in range(3):
            params = step(params)
        jax.block_until_ready(params)
        t0 = time.perf_counter()
        for _ in range(TIMED):
            params = step(params)
        jax.block_until_ready(params)
        plain = (time.perf_counter() - t0) * 1e3 / TIMED
        trace_dir = os.path.join(out, f"jax_lm_{precision}_trace")
        jax.profiler.start_trace(trace_dir)
        for s in range(4):
            with jax.profiler.StepTraceAnnotation("train", step_num=s):
                params = step(params)
        jax.block_until_ready(params)
        jax.profiler.stop_trace()
    return {**meta, "unprofiled_mean_ms": round(plain, 3), "trace_dir": trace_dir}


# --------------------------------------------------------------------------- driver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", default=None, help="run this case in this process")
    ap.add_argument("--cases", default=",".join(TORCH_CASES + OTHER_CASES))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    ap.add_argument("--timeout", type=float, default=150)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.case:
        t0 = time.perf_counter()
        if args.case == "lightning_auto":
            meta = run_lightning_auto(args.out, args.smoke)
        elif args.case == "keras_jax_small":
            meta = run_keras_jax_small(args.out, args.smoke)
        elif args.case == "jax_host_prep":
            meta = run_jax_host_prep(args.out, args.smoke)
        elif args.case.startswith("jax_lm_"):
            meta = run_jax_lm(args.out, args.smoke, args.case.removeprefix("jax_lm_"))
        else:
            meta = run_torch_case(args.case, args.out, args.smoke)
        meta["case"] = args.case
        meta["seconds"] = round(time.perf_counter() - t0, 1)
        _write_meta(args.out, args.case, meta)
        print(json.dumps({k: v for k, v in meta.items() if k != "hook_wall_ms"}), flush=True)
        return
    for case in args.cases.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--case", case]
        if args.smoke:
            cmd.append("--smoke")
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(cmd, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"== {case}: rc={rc} {time.perf_counter() - t0:.1f}s", flush=True)
        walls = None
        if os.path.exists(_meta_path(args.out, case)):
            with open(_meta_path(args.out, case)) as f:
                walls = json.load(f).get("hook_wall_ms")
        if walls:
            print(f"   hook median wall {statistics.median(walls[1:] or walls):.2f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
