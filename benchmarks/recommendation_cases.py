"""Check the report's first recommendation against measured fixes: six real training loops.

Each case is recorded once through tb_gpuprof's own hook (``tb_gpuprof.torch.GpuProfiler``,
25 iterations, window [15, 18)), and its candidate fixes are timed without any hook, each
variant in its own fresh Python process (a subprocess running this script with the internal
``--variant case:name``): warm-up (and compile, timed separately), then 6 blocks of 5 iterations
with ``torch.cuda.synchronize()`` at block ends; median ms/iteration, min/max of the blocks,
samples/s. ``baseline`` runs first and last in every case (an A/A check of drift).

On the H200 (1 GPU, 16 cores, torch 2.11 + CUDA 13, no internet), from the repository root:

    PYTHONUNBUFFERED=1 python benchmarks/recommendation_cases.py --out $OUT/rc \\
        --pack $OUT/rc.tar.gz --budget-s 500

Expected time on the H200: about 8-9 minutes for all six cases: 26 child processes, 18 that
do not compile (~8-15 s each: interpreter + torch import, CUDA init, model build, ~40
iterations) and 8 that compile with Inductor (~15-60 s each: the 4 of compiled_lm, the
`compile` variant of the four others; less when the Inductor cache in /tmp is warm). compiled_lm
is the longest case (~2 min), the others take ~1-1.5 min, cpu_only ~10 s. ``--budget-s 500``
starts no child after 500 s (what is skipped is recorded) and clamps each child's timeout so that
the script ends by ~budget + 60 s. Safer: split it over two calls of ~4-5 minutes each:

    PYTHONUNBUFFERED=1 python benchmarks/recommendation_cases.py --out $OUT/rc1 \
        --pack $OUT/rc1.tar.gz --budget-s 420 --cases compiled_lm,moe,cpu_only
    PYTHONUNBUFFERED=1 python benchmarks/recommendation_cases.py --out $OUT/rc2 \
        --pack $OUT/rc2.tar.gz --budget-s 420 --cases python_collate,item_loop,healthy_cnn

CPU check (here, no GPU): ``python benchmarks/recommendation_cases.py --smoke --out /tmp/rc_smoke``
(tiny models on the CPU, 2 blocks of 2 iterations, window [3, 5); compile variants use
``backend="eager"`` so that only Dynamo's tracing is exercised).

Writes OUT/results.json (per case: description, each variant's timings, the hooked run's
directory and its recommendations, the best measured variant, errors, skipped variants),
OUT/summary.md (a Markdown table of the same, also printed at the end),
OUT/runs/<case>/ (the hook's events file, stored raw trace and report) and OUT/logs/ (each
child's stdout + stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# --------------------------------------------------------------------------- settings

HOOK_ITERS, WINDOW = 25, (15, 18)
SMOKE_HOOK_ITERS, SMOKE_WINDOW = 7, (3, 5)
BLOCKS, PER_BLOCK = 6, 5
SMOKE_BLOCKS, SMOKE_PER_BLOCK = 2, 2
WARMUP, WARMUP_COMPILED = 3, 8  # iterations after the first one (compiled: recompiles settle)
SMOKE_WARMUP = 2

# Which measured variant each recommendation id proposes (when the case has that variant).
FIX_VARIANT = {"compile": ["compile"], "dispatch_overhead": ["compile"], "tf32": ["tf32"],
               "host_sync": ["no_sync", "grouped"],
               "input_pipeline": ["loader_workers4", "data_on_gpu"],
               "batch_size": ["batch_x2"]}


@dataclass
class Loop:
    """One training loop, ready to run: ``step()`` runs one iteration."""

    step: Callable[[], None]
    model: Any
    samples: int  # samples per iteration
    info: dict[str, Any] = field(default_factory=dict)
    compiled: bool = False
    extra: Callable[[], dict[str, Any]] | None = None  # more measurements, before timing


def _torch(smoke: bool, cpu: bool = False) -> tuple[Any, Any]:
    """(torch, device): the CPU in ``--smoke`` (or for ``cpu``), else the GPU, which must be
    there. Seeds torch so that every variant starts from the same weights."""
    import torch

    if not (smoke or cpu) and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device (run with --smoke on a machine without a GPU)")
    dev = torch.device("cpu" if smoke or cpu else "cuda")
    torch.backends.cudnn.benchmark = dev.type == "cuda"
    torch.manual_seed(0)
    return torch, dev


def _sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _compile(torch: Any, model: Any, smoke: bool, in_place: bool = True) -> Any:
    """``model.compile()`` in place (returns the model). In ``--smoke`` (the CPU check) only
    Dynamo's tracing runs (``backend="eager"``): Inductor's C++ build takes minutes on 2 cores."""
    kw = {"backend": "eager"} if smoke else {}
    if in_place:
        model.compile(**kw)
        return model
    return torch.compile(model, **kw)


def _set_tf32(torch: Any, on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


# --------------------------------------------------------------------------- models


def _gpt2(dev: Any, layers: int, d: int, heads: int, ctx: int, vocab: int) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=ctx, vocab_size=vocab)
    return GPT2LMHeadModel(cfg).to(dev)


def _lm_step(torch: Any, dev: Any, model: Any, batch_fn: Callable[[], Any]) -> Callable[[], None]:
    """bf16 autocast, AdamW: ``batch_fn()`` gives (input_ids, labels) on the device."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        ids, labels = batch_fn()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _resnet50(torch: Any, smoke: bool) -> tuple[Any, str]:
    """timm's resnet50, else torchvision's, else tb_gpuprof.demo's (same architecture)."""
    try:
        import timm

        return timm.create_model("resnet50", num_classes=1000), "timm resnet50"
    except ImportError:
        pass
    from tb_gpuprof.demo import build_resnet

    model = build_resnet("resnet50", 1000, width=16 if smoke else 64)
    return model, f"{type(model).__module__} resnet50" + (" (width 16)" if smoke else "")


# --------------------------------------------------------------------------- pure-Python text

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_PUNCT = "0123456789.,;:!?'\"-()"


class WordTokenizer:
    """A word -> id tokenizer in pure Python, character by character (lower-casing, splitting
    on non-alphanumerics, unknown words spelled out letter by letter), then truncation and
    padding to ``seq``: the per-character Python work a slow tokenizer does."""

    PAD, BOS, EOS, UNK = 0, 1, 2, 3

    def __init__(self, words: list[str], seq: int) -> None:
        self.seq = seq
        self.vocab: dict[str, int] = {}
        for ch in _LETTERS + _PUNCT:
            self.vocab[ch] = len(self.vocab) + 4
        for w in words:
            self.vocab.setdefault(w, len(self.vocab) + 4)
        self.size = len(self.vocab) + 4

    def _word(self, w: str, ids: list[int]) -> None:
        i = self.vocab.get(w)
        if i is None:
            ids.extend(self.vocab.get(c, self.UNK) for c in w)
        else:
            ids.append(i)

    def encode(self, text: str) -> list[int]:
        ids, word = [self.BOS], []
        for ch in text:
            c = ch.lower()
            if c.isalnum():
                word.append(c)
                continue
            if word:
                self._word("".join(word), ids)
                word = []
            if not c.isspace():
                ids.append(self.vocab.get(c, self.UNK))
        if word:
            self._word("".join(word), ids)
        ids.append(self.EOS)
        return ids

    def __call__(self, texts: list[str]) -> Any:
        """Tokenize, truncate and pad a batch: a (batch, seq) int64 CPU tensor."""
        import torch

        rows = []
        for t in texts:
            ids = self.encode(t)[:self.seq]  # the whole text is tokenized, then truncated
            rows.append(ids + [self.PAD] * (self.seq - len(ids)))
        return torch.tensor(rows, dtype=torch.long)


def _make_words(rng: random.Random, n: int) -> list[str]:
    seen: set[str] = set()
    words: list[str] = []
    while len(words) < n:
        w = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(2, 9)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _make_doc(rng: random.Random, words: list[str], n: int) -> str:
    """``n`` words, Zipf-like, 10% out of vocabulary, with capitals and punctuation."""
    parts = []
    for k in range(n):
        if rng.random() < 0.9:
            w = words[min(int(rng.paretovariate(0.7)) - 1, len(words) - 1)]
        else:
            w = "".join(rng.choice(_LETTERS) for _ in range(rng.randint(3, 8)))
        if k % 12 == 0:
            w = w.capitalize()
        parts.append(w + ("." if k % 12 == 11 else ("," if rng.random() < 0.05 else "")))
    return " ".join(parts)


class TextDocs:
    """A map-style dataset of raw documents (for the DataLoader variant), endless."""

    def __init__(self, docs: list[str]) -> None:
        self.docs = docs

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, i: int) -> str:
        return self.docs[i % len(self.docs)]


class ImagePool:
    """A map-style dataset over a few pre-made uint8 CPU images (a fast loader), endless."""

    def __init__(self, images: Any, classes: int) -> None:
        self.images, self.classes = images, classes

    def __len__(self) -> int:
        return 10**7

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.images[i % len(self.images)], i % self.classes


# --------------------------------------------------------------------------- the six cases


def case_compiled_lm(variant: str, smoke: bool) -> Loop:
    """HF GPT-2 124M (12 layers, d=768), batch 8 x 512, bf16 autocast, AdamW, compiled in place
    with model.compile(): compile is already in place; the GPU is busy."""
    torch, dev = _torch(smoke)
    batch, seq = (2, 32) if smoke else (8, 512)
    if variant == "batch_x2":
        batch *= 2
    vocab = 1000 if smoke else 50257
    model = _gpt2(dev, 2 if smoke else 12, 64 if smoke else 768, 4 if smoke else 12, seq, vocab)
    if variant != "eager":
        _compile(torch, model, smoke)
    ids = torch.randint(0, vocab, (batch, seq), device=dev)
    step = _lm_step(torch, dev, model, lambda: (ids, ids))
    return Loop(step, model, batch, {"model": "GPT-2 124M (HF GPT2LMHeadModel)", "batch": batch,
                                     "seq": seq, "autocast": "bfloat16",
                                     "compiled": variant != "eager"},
                compiled=variant != "eager")


def case_moe(variant: str, smoke: bool) -> Loop:
    """Mixtral-style MoE (transformers MixtralForCausalLM: hidden 512, 4 layers, 8 experts top-2,
    intermediate 1024, vocab 8192), batch 8 x 256, bf16 autocast, AdamW, eager. The eager
    experts loop (nonzero + one Python branch per expert) syncs with the host every layer;
    ``no_sync``: transformers' batched experts (``experts_implementation="batched_mm"``: every
    expert on every token, no host sync in the routing); ``grouped``: its grouped GEMM
    experts (``"grouped_mm"``: each token through its own experts only, offsets on the
    device)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch, dev = _torch(smoke)
    if variant == "tf32":
        _set_tf32(torch, True)
    batch, seq = (2, 32) if smoke else (8, 256)
    hidden, layers, inter, vocab = (64, 2, 128, 1000) if smoke else (512, 4, 1024, 8192)
    cfg = MixtralConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                        num_local_experts=8, num_experts_per_tok=2, vocab_size=vocab,
                        num_attention_heads=8, num_key_value_heads=8,
                        max_position_embeddings=max(seq, 512),
                        # the per-expert Python loop, or the sync-free batched one
                        experts_implementation={"no_sync": "batched_mm",
                                                "grouped": "grouped_mm"}.get(variant, "eager"))
    model = MixtralForCausalLM(cfg).to(dev)
    fwd = model
    if variant == "compile":
        fwd = _compile(torch, model, smoke, in_place=False)
    ids = torch.randint(0, vocab, (batch, seq), device=dev)
    step = _lm_step(torch, dev, fwd, lambda: (ids, ids))
    return Loop(step, model, batch,
                {"model": f"Mixtral-style MoE {layers}x{hidden}, 8 experts top-2, "
                          f"intermediate {inter}, vocab {vocab}",
                 "batch": batch, "seq": seq, "autocast": "bfloat16", "tf32": variant == "tf32",
                 "experts_implementation": getattr(model.config, "_experts_implementation",
                                                   None),
                 "compiled": variant == "compile"},
                compiled=variant == "compile")


# Sizing of python_collate's tokenization (pure Python, per character): on the 2-core dev box
# the tokenizer runs at ~100 ns per character; a document is ~800 words (~6k characters,
# ~1300 tokens, truncated to 256 after tokenizing the whole text as HF tokenizers do), so a
# batch of 16 is ~97k characters: ~10 ms, plus ~3 ms to truncate, pad and build the tensor,
# ~13 ms. With the model step at ~35 ms on the H200 that is about a quarter of the iteration
# (13 / 48). Each run measures it again on its own host ("collate_ms" in results.json).
COLLATE_WORDS = 800


def _collate_setup(smoke: bool, seq: int) -> tuple[WordTokenizer, list[str]]:
    rng = random.Random(0)
    words = _make_words(rng, 500 if smoke else 8000)
    tok = WordTokenizer(words, seq)
    docs = [_make_doc(rng, words, 60 if smoke else COLLATE_WORDS) for _ in range(32 if smoke
                                                                                 else 96)]
    return tok, docs


def case_python_collate(variant: str, smoke: bool) -> Loop:
    """HF GPT-2 (6 layers, d=512), batch 16 x 256, bf16 autocast, AdamW; every step tokenizes
    and pads a batch of raw text with a pure-Python tokenizer inside the training loop."""
    torch, dev = _torch(smoke)
    batch, seq = (4, 32) if smoke else (16, 256)
    tok, docs = _collate_setup(smoke, seq)
    vocab = (tok.size + 63) // 64 * 64
    model = _gpt2(dev, 2 if smoke else 6, 64 if smoke else 512, 4 if smoke else 8, seq, vocab)
    if variant == "compile":
        _compile(torch, model, smoke)
    info = {"model": "GPT-2 6 layers d=512 (HF)", "batch": batch, "seq": seq,
            "autocast": "bfloat16", "words_per_document": 60 if smoke else COLLATE_WORDS,
            "compiled": variant == "compile"}
    pad = torch.tensor(WordTokenizer.PAD, device=dev)

    def labels(ids: Any) -> Any:
        return torch.where(ids == pad, torch.full_like(ids, -100), ids)

    if variant == "loader_workers4":
        loader = torch.utils.data.DataLoader(
            TextDocs(docs), batch_size=batch, num_workers=2 if smoke else 4, collate_fn=tok,
            pin_memory=dev.type == "cuda", persistent_workers=True, prefetch_factor=4)
        it = iter(loader)
        info["loader"] = "DataLoader(num_workers=4, collate_fn=tokenize+pad, pin_memory=True)"

        def batch_fn() -> tuple[Any, Any]:
            ids = next(it).to(dev, non_blocking=True)
            return ids, labels(ids)
    else:
        k = [0]
        info["loader"] = "tokenize + pad in the training loop"

        def batch_fn() -> tuple[Any, Any]:
            k[0] += batch
            texts = [docs[(k[0] + i) % len(docs)] for i in range(batch)]
            ids = tok(texts).to(dev)
            return ids, labels(ids)

    def collate_ms() -> dict[str, Any]:
        t0 = time.perf_counter()
        for r in range(5):
            tok([docs[(r * batch + i) % len(docs)] for i in range(batch)])
        return {"collate_ms": round((time.perf_counter() - t0) * 1e3 / 5, 3)}

    return Loop(_lm_step(torch, dev, model, batch_fn), model, batch, info,
                compiled=variant == "compile", extra=collate_ms)


def case_item_loop(variant: str, smoke: bool) -> Loop:
    """HF GPT-2 (6 layers, d=512), batch 8 x 256, bf16 autocast, AdamW; the loop reads
    loss.item() and every parameter's gradient norm with .item() every step (host syncs)."""
    torch, dev = _torch(smoke)
    batch, seq = (2, 32) if smoke else (8, 256)
    vocab = 1000 if smoke else 50257
    model = _gpt2(dev, 2 if smoke else 6, 64 if smoke else 512, 4 if smoke else 8, seq, vocab)
    if variant == "compile":
        _compile(torch, model, smoke)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, vocab, (batch, seq), device=dev)
    log: list[Any] = []
    acc: dict[str, Any] = {"n": 0, "loss": None, "norms": None}

    def forward_backward() -> Any:
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    def step_sync() -> None:
        loss = forward_backward()
        log.append(loss.item())
        log.append([p.grad.norm().item() for p in params])
        opt.step()
        opt.zero_grad(set_to_none=True)
        del log[:-200]

    def step_device() -> None:  # the same maths, kept on the device, read every 50 steps
        loss = forward_backward()
        norms = torch.stack([p.grad.norm() for p in params])
        acc["loss"] = loss.detach() if acc["loss"] is None else acc["loss"] + loss.detach()
        acc["norms"] = norms if acc["norms"] is None else acc["norms"] + norms
        acc["n"] += 1
        if acc["n"] % 50 == 0:
            log.append((acc["loss"].item() / 50, (acc["norms"] / 50).tolist()))
            acc["loss"] = acc["norms"] = None
            del log[:-200]
        opt.step()
        opt.zero_grad(set_to_none=True)

    return Loop(step_device if variant == "no_sync" else step_sync, model, batch,
                {"model": "GPT-2 6 layers d=512 (HF)", "batch": batch, "seq": seq,
                 "autocast": "bfloat16", "parameters_read": len(params),
                 "host_syncs_per_step": 0 if variant == "no_sync" else len(params) + 1,
                 "compiled": variant == "compile"},
                compiled=variant == "compile")


def case_healthy_cnn(variant: str, smoke: bool) -> Loop:
    """ResNet-50 (timm), bf16 autocast, channels_last, batch 256 at 224 px, SGD momentum, fed
    by a fast DataLoader (pre-made uint8 CPU images, 8 workers, pinned, non-blocking copies,
    persistent workers; normalised to float on the GPU): a healthy, GPU-bound loop."""
    torch, dev = _torch(smoke)
    batch, size = (4, 64) if smoke else (256, 224)
    model, name = _resnet50(torch, smoke)
    model = model.to(dev).to(memory_format=torch.channels_last)
    if variant == "compile":
        _compile(torch, model, smoke)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (16, 3, size, size), dtype=torch.uint8, generator=g)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    workers = 2 if smoke else 8
    info = {"model": name, "batch": batch, "image_size": size, "autocast": "bfloat16",
            "channels_last": True, "optimizer": "SGD momentum 0.9",
            "compiled": variant == "compile"}
    if variant == "data_on_gpu":
        x_dev = images[torch.arange(batch) % len(images)].to(dev)
        y_dev = (torch.arange(batch) % 1000).to(dev)
        info["loader"] = "one uint8 batch kept on the GPU (no input pipeline)"

        def batch_fn() -> tuple[Any, Any]:
            return x_dev, y_dev
    else:
        loader = torch.utils.data.DataLoader(
            ImagePool(images, 1000), batch_size=batch, num_workers=workers,
            pin_memory=dev.type == "cuda", persistent_workers=True)  # 2 x 8 batches of 38 MB
        it = iter(loader)
        info["loader"] = (f"DataLoader(num_workers={workers}, pin_memory=True, "
                          "persistent_workers=True), uint8, non_blocking copies")

        def batch_fn() -> tuple[Any, Any]:
            x, y = next(it)
            return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        x, y = batch_fn()
        x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return Loop(step, model, batch, info, compiled=variant == "compile")


def case_cpu_only(variant: str, smoke: bool) -> Loop:
    """A tiny MLP trained on the CPU through GpuProfiler (CUDA_VISIBLE_DEVICES=""): the report
    must say there is no GPU work rather than recommend GPU fixes."""
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return Loop(step, model, 64, {"model": "MLP 256-512-512-10 on the CPU", "batch": 64,
                                  "device": "cpu", "CUDA_VISIBLE_DEVICES": ""})


CASES: dict[str, dict[str, Any]] = {
    "compiled_lm": {"fn": case_compiled_lm, "variants": ["eager", "batch_x2"]},
    "moe": {"fn": case_moe, "variants": ["no_sync", "grouped", "compile", "tf32"]},
    "python_collate": {"fn": case_python_collate, "variants": ["loader_workers4", "compile"]},
    "item_loop": {"fn": case_item_loop, "variants": ["no_sync", "compile"]},
    "healthy_cnn": {"fn": case_healthy_cnn, "variants": ["data_on_gpu", "compile"]},
    "cpu_only": {"fn": case_cpu_only, "variants": None, "env": {"CUDA_VISIBLE_DEVICES": ""}},
}

# --------------------------------------------------------------------------- child processes


def _environment(torch: Any, dev: Any) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                           "device": str(dev)}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    try:  # DataLoader workers hand batches over through /dev/shm
        env["dev_shm_gib"] = round(shutil.disk_usage("/dev/shm").total / 2**30, 1)
    except OSError:
        pass
    return env


def run_variant(case: str, variant: str, smoke: bool) -> dict[str, Any]:
    """Time ``variant`` of ``case`` without any hook (this process runs nothing else)."""
    t_start = time.perf_counter()
    loop = CASES[case]["fn"](variant, smoke)
    torch, dev = _torch(smoke, cpu=case == "cpu_only")
    build_s = time.perf_counter() - t_start
    res: dict[str, Any] = {"case": case, "variant": variant, "info": loop.info,
                           "samples_per_iteration": loop.samples, "build_s": round(build_s, 2),
                           "environment": _environment(torch, dev)}
    if loop.extra:
        res.update(loop.extra())
    blocks, per_block = (SMOKE_BLOCKS, SMOKE_PER_BLOCK) if smoke else (BLOCKS, PER_BLOCK)
    warm = SMOKE_WARMUP if smoke else (WARMUP_COMPILED if loop.compiled else WARMUP)
    _sync(torch, dev)
    t0 = time.perf_counter()
    loop.step()  # the first iteration: compiles when compiled, cuDNN autotuning, allocations
    _sync(torch, dev)
    first_s = time.perf_counter() - t0
    res["first_iteration_s"] = round(first_s, 3)
    if loop.compiled:
        res["compile_s"] = round(first_s, 3)  # includes that first iteration's own run
    t0 = time.perf_counter()
    for _ in range(warm):
        loop.step()
    _sync(torch, dev)
    res["warmup_iterations"] = warm
    res["warmup_s"] = round(time.perf_counter() - t0, 3)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    block_ms = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(per_block):
            loop.step()
        _sync(torch, dev)
        block_ms.append((time.perf_counter() - t0) * 1e3 / per_block)
    med = statistics.median(block_ms)
    res.update({"blocks": blocks, "iterations_per_block": per_block,
                "block_ms": [round(b, 3) for b in block_ms], "median_ms": round(med, 3),
                "min_ms": round(min(block_ms), 3), "max_ms": round(max(block_ms), 3),
                "ms_per_sample": round(med / loop.samples, 4),
                "samples_per_s": round(loop.samples * 1e3 / med, 1)})
    if dev.type == "cuda":
        res["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        res["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30,
                                      1)
    res["seconds"] = round(time.perf_counter() - t_start, 2)
    return res


def _rec_summary(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "title", "severity", "estimated_saving_ms", "estimated_range_pct",
            "predicted_iteration_ms", "estimate_basis")
    return {k: r.get(k) for k in keys if k in r}


def run_hooked(case: str, out: str, smoke: bool) -> dict[str, Any]:
    """Record the baseline loop of ``case`` through GpuProfiler into OUT/runs/<case>."""
    from tb_gpuprof.torch import GpuProfiler

    t_start = time.perf_counter()
    loop = CASES[case]["fn"]("baseline", smoke)
    torch, dev = _torch(smoke, cpu=case == "cpu_only")
    iters, window = (SMOKE_HOOK_ITERS, SMOKE_WINDOW) if smoke else (HOOK_ITERS, WINDOW)
    run_dir = os.path.join(out, "runs", case)
    prof = GpuProfiler(run_dir, iter_start=window[0], iter_stop=window[1], model=loop.model)
    t0 = time.perf_counter()
    with prof:
        for _ in range(iters):
            loop.step()
            prof.step()
    _sync(torch, dev)
    loop_s = time.perf_counter() - t0
    report = prof.report or {}
    recs = [_rec_summary(r) for r in report.get("recommendations") or []]
    res: dict[str, Any] = {
        "case": case, "variant": "hooked", "info": loop.info, "run_dir": run_dir,
        "run_dir_rel": os.path.relpath(run_dir, out), "iterations": iters,
        "window": list(window), "loop_s": round(loop_s, 2),
        "report_found": bool(report), "recommendations": recs,
        "first_recommendation": recs[0]["id"] if recs else None,
        "warnings": list(report.get("warnings") or []),
        "bottleneck": {k: v for k, v in (report.get("bottleneck") or {}).items()
                       if k in ("bound", "verdict", "basis", "mean_pct", "corrected_pct")},
        "iteration_ms": {k: v for k, v in (report.get("iterations") or {}).items()
                         if k in ("median_ms", "mean_ms", "gpu_busy_mean_ms",
                                  "unprofiled_median_ms", "profiler_overhead_ratio")},
        "flags": (report.get("system") or {}).get("flags"),
        "files": sorted(os.path.relpath(os.path.join(d, f), run_dir)
                        for d, _, fs in os.walk(run_dir) for f in fs),
        "environment": _environment(torch, dev)}
    walls = list(getattr(prof, "_wall_ms", []) or [])
    if walls:
        res["hook_wall_ms_median"] = round(statistics.median(walls[1:] or walls), 3)
    res["seconds"] = round(time.perf_counter() - t_start, 2)
    return res


def child_main(args: argparse.Namespace) -> int:
    case, _, variant = args.variant.partition(":")
    try:
        if case not in CASES:
            raise ValueError(f"unknown case {case!r}")
        if variant == "hooked":
            res = run_hooked(case, args.out, args.smoke)
        else:
            res = run_variant(case, variant, args.smoke)
        rc = 0
    except Exception as e:  # recorded; the parent goes on
        traceback.print_exc()
        res = {"case": case, "variant": variant, "error": f"{type(e).__name__}: {e}"[:2000]}
        rc = 1
    if args.result:
        with open(args.result, "w") as f:
            json.dump(res, f, indent=1)
    return rc


# --------------------------------------------------------------------------- driver


def _save(out: str, results: dict[str, Any]) -> None:
    tmp = os.path.join(out, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, os.path.join(out, "results.json"))


def _last_error_line(log_path: str) -> str:
    try:
        with open(log_path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:500] if lines else "no output"


def _spawn(case: str, variant: str, args: argparse.Namespace, timeout: float,
           env_extra: dict[str, str]) -> dict[str, Any]:
    label = f"{case}.{variant}"
    log_path = os.path.join(args.out, "logs", f"{label}.log")
    res_path = os.path.join(args.out, "logs", f"{label}.json")
    if os.path.exists(res_path):
        os.remove(res_path)
    cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out,
           "--variant", f"{case}:{variant}", "--result", res_path]
    if args.smoke:
        cmd.append("--smoke")
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(env_extra)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            rc: Any = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     timeout=timeout, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    res: dict[str, Any] = {}
    if os.path.exists(res_path):
        with open(res_path) as f:
            res = json.load(f)
    res["process_s"] = round(wall, 2)
    res["returncode"] = rc
    res["log"] = os.path.relpath(log_path, args.out)
    if rc == "timeout":
        res["error"] = f"timeout after {timeout:.0f} s ({_last_error_line(log_path)})"
    elif rc != 0 and "error" not in res:
        res["error"] = f"exit {rc}: {_last_error_line(log_path)}"
    return res


def _judge(case_res: dict[str, Any]) -> dict[str, Any]:
    """Which measured variant is best per sample, against the mean of both baselines, and
    whether it is the one the first recommendation proposes."""
    runs = case_res["variants"]
    base = [runs[k]["ms_per_sample"] for k in ("baseline", "baseline_last")
            if "ms_per_sample" in runs.get(k, {})]
    if not base:
        return {"note": "no baseline timing"}
    ref = statistics.mean(base)
    aa_pct = abs(base[0] - base[-1]) / ref * 100 if len(base) == 2 else None
    noise = max(3.0, 2 * aa_pct) if aa_pct is not None else 3.0
    speedups = {k: round(ref / v["ms_per_sample"], 3) for k, v in runs.items()
                if not k.startswith("baseline") and "ms_per_sample" in v}
    best = max(speedups, key=speedups.get) if speedups else None
    if best is not None and (speedups[best] - 1) * 100 < noise:
        best = None  # nothing beats the baseline by more than the noise
    first = (case_res.get("hooked") or {}).get("first_recommendation")
    proposed = [v for v in FIX_VARIANT.get(first or "", []) if v in runs]
    return {"baseline_ms_per_sample": round(ref, 4),
            "aa_drift_pct": None if aa_pct is None else round(aa_pct, 2),
            "noise_threshold_pct": round(noise, 2), "speedup_per_sample": speedups,
            "best_variant": best, "first_recommendation": first,
            "first_recommendation_variant": proposed[0] if proposed else None,
            "first_recommendation_measured": bool(proposed),
            "agrees": (proposed[0] == best) if proposed else (first is None and best is None)}


def _summary(results: dict[str, Any]) -> str:
    """A Markdown table of every case: the hook's first recommendation and the measured fixes."""
    lines = ["| case | first recommendation (est. saving) | run | median ms/it [min-max] | "
             "samples/s | speed-up per sample |", "| --- | --- | --- | --- | --- | --- |"]
    for case, cr in results["cases"].items():
        hooked = cr.get("hooked") or {}
        recs = hooked.get("recommendations") or []
        first = ("not run" if not hooked else "error" if hooked.get("error") else "none")
        if recs:
            saving = recs[0].get("estimated_saving_ms")
            first = f"`{recs[0]['id']}`" + (f" (~{saving:.1f} ms)" if saving else "")
        check = cr.get("check") or {}
        speedups = check.get("speedup_per_sample") or {}
        rows = [(k, v) for k, v in cr["variants"].items()] or [("hooked only", {})]
        for i, (label, v) in enumerate(rows):
            if "median_ms" in v:
                timing = f"{v['median_ms']:.2f} [{v['min_ms']:.2f}-{v['max_ms']:.2f}]"
                sps = f"{v['samples_per_s']:.1f}"
            else:
                timing, sps = (v.get("error") or "-")[:60], "-"
            sp = speedups.get(label)
            lines.append(f"| {case if i == 0 else ''} | {first if i == 0 else ''} | {label} | "
                         f"{timing} | {sps} | {'' if sp is None else f'{sp:.2f}x'} |")
        if check:
            lines.append(f"| | best measured: {check.get('best_variant')}; agrees: "
                         f"{check.get('agrees')}; A/A drift {check.get('aa_drift_pct')}% | | | | |")
    return "\n".join(lines) + "\n"


def _pack(out: str, pack: str) -> None:
    limit = 16 * 2**20
    with tarfile.open(pack, "w:gz") as tar:
        tar.add(out, arcname=os.path.basename(os.path.normpath(out)))
    size = os.path.getsize(pack)
    print(f"packed {out} -> {pack} ({size / 2**20:.1f} MiB)", flush=True)
    if size > limit:  # too big to come back: leave out the largest files (the raw traces)
        big = 4 * 2**20
        with tarfile.open(pack, "w:gz") as tar:
            tar.add(out, arcname=os.path.basename(os.path.normpath(out)),
                    filter=lambda ti: None if ti.isfile() and ti.size > big else ti)
        print(f"  over 16 MiB: repacked without files > 4 MiB "
              f"({os.path.getsize(pack) / 2**20:.1f} MiB)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory (OUT_DIR)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new child process past this many seconds since start")
    ap.add_argument("--child-timeout-s", type=float, default=180,
                    help="timeout of each child process (default 180 s)")
    ap.add_argument("--pack", default=None, help="tar.gz OUT_DIR into this file at the end")
    ap.add_argument("--variants", type=lambda s: [v for v in s.split(",") if v], default=None,
                    help="only these variants (with the baselines), and no hooked run")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # internal: case:name
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    if args.variant:
        return child_main(args)

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    t_start = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {"argv": sys.argv, "smoke": args.smoke, "budget_s": args.budget_s,
                 "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "host": platform.node(), "cpus": os.cpu_count(),
                 "timing": {"blocks": SMOKE_BLOCKS if args.smoke else BLOCKS,
                            "iterations_per_block": SMOKE_PER_BLOCK if args.smoke
                            else PER_BLOCK,
                            "hook_iterations": SMOKE_HOOK_ITERS if args.smoke else HOOK_ITERS,
                            "window": list(SMOKE_WINDOW if args.smoke else WINDOW)}},
        "cases": {}}
    for case in cases:
        spec = CASES[case]
        doc = (spec["fn"].__doc__ or "").split()
        case_res: dict[str, Any] = {"description": " ".join(doc), "hooked": None,
                                    "variants": {}, "errors": [], "skipped": []}
        results["cases"][case] = case_res
        plan = [] if args.variants else [("hooked", "hooked")]
        if spec["variants"] is not None:
            chosen = [v for v in spec["variants"] if not args.variants or v in args.variants]
            plan += [("baseline", "baseline")] + [(v, v) for v in chosen]
            plan += [("baseline_last", "baseline")]
        for label, variant in plan:
            elapsed = time.perf_counter() - t_start
            if args.budget_s is not None and elapsed > args.budget_s:
                case_res["skipped"].append(label)
                print(f"[{elapsed:6.1f}s] {case}:{label} skipped (budget {args.budget_s:.0f} s)",
                      flush=True)
                _save(args.out, results)
                continue
            timeout = args.child_timeout_s
            if args.budget_s is not None:  # end by about budget + 60 s
                timeout = max(30.0, min(timeout, args.budget_s + 60 - elapsed))
            res = _spawn(case, variant, args, timeout, spec.get("env", {}))
            res["label"] = label
            if label == "hooked":
                case_res["hooked"] = res
            else:
                case_res["variants"][label] = res
            if res.get("error"):
                case_res["errors"].append(f"{label}: {res['error']}")
                line = f"ERROR {res['error'][:200]}"
            elif label == "hooked":
                line = (f"recommendations {[r['id'] for r in res.get('recommendations', [])]} "
                        f"(loop {res.get('loop_s')} s)")
            else:
                line = (f"{res['median_ms']:.2f} ms/it [{res['min_ms']:.2f}-{res['max_ms']:.2f}] "
                        f"{res['samples_per_s']:.1f} samples/s")
                if "compile_s" in res:
                    line += f", compile {res['compile_s']:.1f} s"
                if "collate_ms" in res:
                    line += f", collate {res['collate_ms']:.1f} ms"
            print(f"[{time.perf_counter() - t_start:6.1f}s] {case}:{label} "
                  f"({res['process_s']:.1f} s) {line}", flush=True)
            _save(args.out, results)
        if spec["variants"] is not None:
            case_res["check"] = _judge(case_res)
            print(f"   {case}: {json.dumps(case_res['check'])}", flush=True)
        _save(args.out, results)
    results["meta"]["total_s"] = round(time.perf_counter() - t_start, 1)
    _save(args.out, results)
    table = _summary(results)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table)
    print(table, flush=True)
    print(f"done in {results['meta']['total_s']} s: {os.path.join(args.out, 'results.json')}",
          flush=True)
    if args.pack:
        _pack(args.out, args.pack)
    return 0


if __name__ == "__main__":
    sys.exit(main())
