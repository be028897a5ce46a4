"""What the out-of-memory report needs from the training process, read only when an
out-of-memory error reaches the hook (nothing runs before): the CUDA allocator's state, the
model's and optimizer's tensors (torch_memory.record_tensors) and facts about them.

Reading only: nothing is allocated on the device, freed or set. ``torch`` is never imported
here: :func:`is_out_of_memory` looks for it in ``sys.modules`` (an error raised by torch means
torch is imported).
"""

from __future__ import annotations

import sys
from typing import Any

from . import torch_memory

CUDA_OOM_PREFIX = "CUDA out of memory"


def is_out_of_memory(exc: BaseException | None) -> bool:
    """``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``), or a ``RuntimeError``
    whose message starts with "CUDA out of memory" (torch before the dedicated class)."""
    if exc is None:
        return False
    torch = sys.modules.get("torch")
    if torch is not None:
        kinds = tuple(k for k in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None))
                      if isinstance(k, type))
        if kinds and isinstance(exc, kinds):
            return True
    return isinstance(exc, RuntimeError) and str(exc).startswith(CUDA_OOM_PREFIX)


def allocator_at_failure(torch: Any, device: int) -> dict[str, Any]:
    """The caching allocator now: reserve, allocation, inactive split bytes, its segments and
    their largest free (inactive) block, and the device's free and total memory."""
    stats = torch.cuda.memory_stats(device)
    try:
        segments = torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:
        segments = torch.cuda.memory_snapshot()
    mine = [s for s in segments if s.get("device") == device]
    free = [b["size"] for s in mine for b in s.get("blocks", ()) if b.get("state") == "inactive"]
    try:
        device_free, device_total = torch.cuda.mem_get_info(device)
    except Exception:  # some drivers refuse it right after a failure: the message has them
        device_free = device_total = None
    return {"reserved_bytes": stats.get("reserved_bytes.all.current"),
            "allocated_bytes": stats.get("allocated_bytes.all.current"),
            "inactive_split_bytes": stats.get("inactive_split_bytes.all.current"),
            "largest_free_block_bytes": max(free, default=0),
            "segments": len(mine),
            "device_free_bytes": device_free, "device_total_bytes": device_total}


def model_facts(torch: Any, model: Any, optimizer: Any) -> dict[str, Any]:
    """The trainable parameters' bytes, their dtypes, the optimizer's class and how many
    modules hold parameters (for the checkpointing estimate)."""
    params: list[Any] = []
    modules = 0
    if model is not None:
        params = list(model.parameters())
        modules = sum(1 for m in model.modules() if any(True for _ in m.parameters(False)))
    elif optimizer is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
    seen: set[int] = set()
    trainable = 0
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            trainable += p.numel() * p.element_size()
    return {"trainable_parameter_bytes": trainable,
            "parameter_dtypes": sorted({str(p.dtype) for p in params}),
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "parametrized_modules": modules}


def capture(torch: Any, model: Any, optimizer: Any, device: int | None) -> dict[str, Any]:
    """Everything read at the failure, as plain data (analysis/oom.py's inputs)."""
    return {"allocator": allocator_at_failure(torch, device) if device is not None else None,
            "tensors": torch_memory.record_tensors(torch, model, optimizer, None)
            if model is not None or optimizer is not None else None,
            "model": model_facts(torch, model, optimizer)}


def batch_size_of(batch: Any) -> int | None:
    """The leading dimension of the batch's first tensor (the batch itself, or the first
    tensor in a tuple, list or dict at its top level); None when there is none. Cheap: no
    recursion, a few attribute reads."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (tuple, list)):
        batch = batch[0] if batch else None
    shape = getattr(batch, "shape", None)
    if shape is None or not len(shape):
        return None
    n = shape[0]
    return n if isinstance(n, int) else None


def batch_size_of_keywords(kwargs: dict[str, Any] | None) -> int | None:
    """The leading dimension of the first keyword argument that is a tensor with one (an HF
    model's ``input_ids=``, ``pixel_values=``); None when there is none."""
    for value in (kwargs or {}).values():
        if getattr(value, "shape", None) is not None:
            return batch_size_of(value)
    return None


__all__ = ["allocator_at_failure", "batch_size_of", "batch_size_of_keywords", "capture",
           "is_out_of_memory", "model_facts"]
