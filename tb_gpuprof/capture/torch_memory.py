"""What the memory peak's decomposition needs from the training process, read once at the
window's stop: the model's parameters and their gradients, the optimizer's state tensors
(each one's storage address and size: the analysis finds them among the allocator's events by
address), and the CUDA caching allocator's figures for fragmentation.

The record is the analysis' ``memory_parts.TensorRecord`` as plain JSON-able columns (this
module imports no analysis: it runs on the training thread). Reading only: no tensor is
touched beyond its storage's address and size, nothing is set.
"""

from __future__ import annotations

from typing import Any

COLUMNS = ("kind", "param", "key", "device", "ptr", "storage_bytes", "tensor_bytes")


def record_tensors(torch: Any, model: Any, optimizer: Any, cuda_device: int | None
                   ) -> dict[str, Any]:
    """The record (memory_parts.TensorRecord's fields). Parameters are the model's
    (``named_parameters``), else the optimizer's parameter groups'; ``cuda_device``: the
    device whose allocator to read (None: no CUDA)."""
    record: dict[str, Any] = {name: [] for name in COLUMNS}
    record.update(recorded=[], allocator={}, notes=[])
    skipped = [0]
    named = _named_parameters(model, optimizer)
    if named is not None:
        record["recorded"] += ["parameters", "gradients"]
        for name, p in named:
            _add(record, skipped, torch, "parameters", name, None, p)
            if p.grad is not None:
                _add(record, skipped, torch, "gradients", name, None, p.grad)
    if optimizer is not None:
        record["recorded"].append("optimizer_state")
        names = {id(p): name for name, p in named or ()}
        for i, (p, state) in enumerate(optimizer.state.items()):
            name = names.get(id(p), f"(not in the model) {i}")
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    _add(record, skipped, torch, "optimizer_state", name, str(key), value)
    if skipped[0]:
        record["notes"].append(f"{skipped[0]} tensors without a plain storage (sparse, "
                               "DTensor, other subclasses) were left out")
    if cuda_device is not None:
        record["allocator"][f"cuda:{cuda_device}"] = allocator_at_stop(torch, cuda_device)
    return record


def _named_parameters(model: Any, optimizer: Any) -> list[tuple[str, Any]] | None:
    if model is not None:
        return list(model.named_parameters())
    if optimizer is not None:
        return [(f"group{g}.{j}", p) for g, group in enumerate(optimizer.param_groups)
                for j, p in enumerate(group["params"])]
    return None


def _add(record: dict[str, Any], skipped: list[int], torch: Any, kind: str, param: str,
         key: str | None, t: Any) -> None:
    """One tensor's row; a tensor without a plain storage, or on the meta device (no
    memory), is counted in ``skipped`` instead."""
    try:
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        skipped[0] += 1
        return
    if ptr == 0:
        return
    for column, value in zip(COLUMNS, (kind, param, key, str(t.device), ptr, nbytes,
                                       t.numel() * t.element_size()), strict=True):
        record[column].append(value)


def allocator_at_stop(torch: Any, device: int) -> dict[str, int | None]:
    """The caching allocator's reserve, allocation and free split bytes, and its largest free
    block (the largest inactive block of its segments: the largest allocation it can serve
    without asking the driver for more)."""
    stats = torch.cuda.memory_stats(device)
    try:  # without the allocator history's trace entries, where this torch can leave them out
        segments = torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:
        segments = torch.cuda.memory_snapshot()
    free = [block["size"] for segment in segments if segment.get("device") == device
            for block in segment.get("blocks", ()) if block.get("state") == "inactive"]
    return {"reserved_bytes": stats.get("reserved_bytes.all.current"),
            "allocated_bytes": stats.get("allocated_bytes.all.current"),
            "inactive_split_bytes": stats.get("inactive_split_bytes.all.current"),
            "largest_free_block_bytes": max(free, default=0)}
