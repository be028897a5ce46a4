"""The out-of-memory report (issue 40, item 2): what the device held when an allocation failed,
what held it at the last known peak, and which fix would make the step fit, each with its
predicted effect in bytes.

Framework-free and pure: the PyTorch hook reads the allocator, the model's and optimizer's
tensors and its own memory history at the failure (tb_gpuprof/capture/torch_oom.py) and passes
them here as plain dicts; nothing is imported from torch. Schema: docs/report-schema.md#the-
out-of-memory-report.

The prediction: a training step's peak at batch size ``B`` is taken as ``fixed + B * a``,
``fixed`` the parameters, their gradients and the optimizer's state (as they are in steady
training: gradients as large as the trainable parameters, an Adam's two states each as large
as its parameters even before its first step made them), ``a`` the rest of the peak per sample
(activations, temporaries, the batch). ``a`` comes from a peak measured at a known batch size
(the window's ``peak_parts``, the hook's always-on per-iteration peaks) and from the failure
itself: the allocator held ``allocated`` and asked for ``requested`` more, so the failing step
needed at least ``allocated + requested``: a lower bound on its peak. Where only the failure
is known, ``a`` is a lower bound and the largest batch that fits is an upper bound
(``bound: "at_most"``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

OOM_REPORT_VERSION = 1
# Optimizer state tensors per parameter (each as large as its parameter), by class name, for
# the optimizer whose state does not exist yet (an Adam's first step makes it).
STATES_PER_PARAMETER = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2,
                        "Adadelta": 2, "Adagrad": 1, "RMSprop": 1, "SGD": 1, "Rprop": 2}
_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = r"([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)"
_MESSAGE_FIELDS = {
    "tried_to_allocate_bytes": re.compile(rf"Tried to allocate {_SIZE}"),
    "total_capacity_bytes": re.compile(rf"total capacity of {_SIZE}"),
    "free_bytes": re.compile(rf"of which {_SIZE} is free"),
    "process_in_use_bytes": re.compile(rf"this process has {_SIZE} memory in use"),
    "pytorch_allocated_bytes": re.compile(rf"Of the allocated memory {_SIZE} is allocated by "
                                          "PyTorch"),
    "pytorch_reserved_unallocated_bytes": re.compile(rf"and {_SIZE} is reserved by PyTorch but "
                                                     "unallocated"),
}
_GPU = re.compile(r"GPU (\d+) has a total capacity")


def parse_message(message: str) -> dict[str, Any]:
    """The figures PyTorch's CUDA out-of-memory message holds (each None where it is absent):
    ``gpu``, ``tried_to_allocate_bytes``, ``total_capacity_bytes``, ``free_bytes``,
    ``process_in_use_bytes`` (with memory outside PyTorch), ``pytorch_allocated_bytes``,
    ``pytorch_reserved_unallocated_bytes``. Sizes are as printed (2 decimals), so within
    0.5% of a GiB figure's unit."""
    out: dict[str, Any] = {}
    m = _GPU.search(message)
    out["gpu"] = int(m.group(1)) if m else None
    for name, pattern in _MESSAGE_FIELDS.items():
        m = pattern.search(message)
        out[name] = round(float(m.group(1)) * _UNITS[m.group(2)]) if m else None
    return out


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def oom_report(*, error_type: str, message: str, step: int | None, device: str | None,
               allocator: dict[str, Any] | None, tensors: dict[str, Any] | None,
               model: dict[str, Any] | None, batch_size: int | None,
               window: dict[str, Any] | None = None,
               history: Sequence[dict[str, Any]] = (),
               autocast: str | None = None) -> dict[str, Any]:
    """The report (docs/report-schema.md#the-out-of-memory-report).

    ``allocator``: the CUDA caching allocator at the failure (``reserved_bytes``,
    ``allocated_bytes``, ``inactive_split_bytes``, ``largest_free_block_bytes``, ``segments``,
    ``device_free_bytes``, ``device_total_bytes``), None without CUDA. ``tensors``: the hook's
    record of the model's and optimizer's tensors at the failure (capture/torch_memory's
    columns). ``model``: ``trainable_parameter_bytes``, ``parameter_dtypes``, ``optimizer``
    (class name), ``parametrized_modules``. ``batch_size``: the failing step's. ``window``:
    the window's ``peak_parts`` on this device and its ``batch_size``. ``history``: the
    hook's always-on per-iteration peaks (``step``, ``batch_size``, ``allocated_bytes``).
    ``autocast``: the loop's autocast dtype where the hook saw it."""
    parsed = parse_message(message)
    notes: list[str] = []
    alloc = dict(allocator) if allocator is not None else None
    state = _allocator_state(alloc, parsed)
    if alloc is None:
        notes.append("the CUDA allocator could not be read (no CUDA here): its state is "
                     "the error message's figures only")
    held = _recorded_bytes(tensors, device, notes)
    fixed = _steady_fixed(held, model, notes)
    requested = parsed["tried_to_allocate_bytes"]
    at_failure = _first(parsed["pytorch_allocated_bytes"], state["allocated_bytes"])
    budget = _budget(parsed, alloc)
    peak = _last_peak(window, history, held, at_failure, requested, batch_size)
    basis = _per_sample(window, history, fixed, at_failure, requested, batch_size, notes)
    demand = activations = None
    if basis is not None and batch_size:
        activations = basis.per_sample * batch_size
        demand = basis.fixed + activations
    usable = None if budget is None else budget * (basis.packing if basis else 1.0)
    advice = _advice(state, fixed, basis, batch_size, activations, demand, usable,
                     requested, model, autocast, notes)
    return {
        "version": OOM_REPORT_VERSION,
        "error": {"type": error_type, "message": message},
        "step": step,
        "device": device,
        "allocator": state,
        "message_figures": parsed,
        "budget_bytes": budget,
        "batch_size": batch_size,
        "last_peak": peak,
        "largest_part": peak["largest_part"] if peak else None,
        "fixed_bytes": fixed,
        "per_sample_bytes": None if basis is None else round(basis.per_sample),
        "per_sample_basis": None if basis is None else basis.source,
        "prediction_fixed_bytes": None if basis is None else round(basis.fixed),
        "allocator_packing": None if basis is None else round(basis.packing, 4),
        "usable_bytes": None if usable is None else round(usable),
        "predicted_demand_bytes": None if demand is None else round(demand),
        "advice": advice,
        "notes": notes,
    }


def _allocator_state(alloc: dict[str, Any] | None, parsed: dict[str, Any]) -> dict[str, Any]:
    """The allocator's figures; where the allocator could not be read, the message's."""
    a = alloc or {}
    reserved = a.get("reserved_bytes")
    if reserved is None and parsed["pytorch_allocated_bytes"] is not None and \
            parsed["pytorch_reserved_unallocated_bytes"] is not None:
        reserved = parsed["pytorch_allocated_bytes"] + \
            parsed["pytorch_reserved_unallocated_bytes"]
    allocated = _first(a.get("allocated_bytes"), parsed["pytorch_allocated_bytes"])
    return {"available": alloc is not None,
            "reserved_bytes": reserved,
            "allocated_bytes": allocated,
            "reserved_unallocated_bytes": None if reserved is None or allocated is None
            else max(reserved - allocated, 0),
            "largest_free_block_bytes": a.get("largest_free_block_bytes"),
            "segments": a.get("segments"),
            "inactive_split_bytes": a.get("inactive_split_bytes"),
            "device_free_bytes": _first(a.get("device_free_bytes"), parsed["free_bytes"]),
            "device_total_bytes": _first(a.get("device_total_bytes"),
                                         parsed["total_capacity_bytes"])}


def _budget(parsed: dict[str, Any], alloc: dict[str, Any] | None) -> int | None:
    """What PyTorch's allocator could hold on the device: its reserve at the failure and what
    was still free (the CUDA context, other libraries and other processes keep the rest)."""
    a = alloc or {}
    if parsed["pytorch_allocated_bytes"] is not None and parsed["free_bytes"] is not None \
            and parsed["pytorch_reserved_unallocated_bytes"] is not None:
        return parsed["pytorch_allocated_bytes"] + \
            parsed["pytorch_reserved_unallocated_bytes"] + parsed["free_bytes"]
    if a.get("reserved_bytes") is not None and a.get("device_free_bytes") is not None:
        return int(a["reserved_bytes"] + a["device_free_bytes"])
    return None


def _recorded_bytes(tensors: dict[str, Any] | None, device: str | None,
                    notes: list[str]) -> dict[str, int | None]:
    """Parameters, gradients, optimizer state on ``device`` now (a storage once), None for a
    kind the hook could not record. Without CUDA (a simulated failure) every device's."""
    out: dict[str, int | None] = {"parameters": None, "gradients": None,
                                  "optimizer_state": None}
    if not tensors:
        notes.append("no model or optimizer was given: parameters, gradients and optimizer "
                      "state are not known")
        return out
    recorded = set(tensors.get("recorded") or ())
    devices = set(tensors.get("device") or ())
    on = device if device in devices else None
    if on is None and devices:
        notes.append(f"no recorded tensor is on {device or 'a CUDA device (none here)'}: "
                     f"the tensors on {', '.join(sorted(devices))} are counted")
    seen: set[int] = set()
    for kind in out:
        if kind in recorded:
            out[kind] = 0
    for kind, dev, ptr, nbytes in zip(tensors.get("kind") or (), tensors.get("device") or (),
                                      tensors.get("ptr") or (),
                                      tensors.get("storage_bytes") or (), strict=True):
        if (on is not None and dev != on) or ptr in seen or out.get(kind) is None:
            continue
        seen.add(ptr)
        out[kind] = (out[kind] or 0) + nbytes
    return out


def _steady_fixed(held: dict[str, int | None], model: dict[str, Any] | None,
                  notes: list[str]) -> dict[str, Any]:
    """The step's fixed bytes in steady training: the parameters, gradients as large as the
    trainable parameters where fewer are held now (before the first backward, or after
    ``zero_grad(set_to_none=True)``), the optimizer's state as its class keeps it where it
    has none yet."""
    m = model or {}
    params = held["parameters"] or 0
    trainable = m.get("trainable_parameter_bytes")
    grads = max(held["gradients"] or 0, trainable or 0)
    state = held["optimizer_state"] or 0
    per_param = STATES_PER_PARAMETER.get(m.get("optimizer") or "")
    if not state and per_param and trainable:
        state = per_param * trainable  # SGD without momentum keeps none: an upper bound
        notes.append(f"the optimizer ({m.get('optimizer')}) holds no state yet: its "
                     f"{per_param} state tensor(s) per parameter are counted as its first "
                     "step will make them")
    return {"parameters": params, "gradients": grads, "optimizer_state": state,
            "total": params + grads + state, "held_now": dict(held)}


def _last_peak(window: dict[str, Any] | None, history: Sequence[dict[str, Any]],
               held: dict[str, int | None], at_failure: int | None, requested: int | None,
               batch_size: int | None) -> dict[str, Any] | None:
    """The decomposition at the last known peak: the window's where it is at least the
    failure's, else the failure's own (allocated + the request it failed on, the recorded
    tensors split out), else the highest always-on peak."""
    recorded = [(k, v) for k, v in held.items() if v is not None]
    pp = (window or {}).get("peak_parts")
    failed = None if at_failure is None else at_failure + (requested or 0)
    if pp and (failed is None or (pp.get("allocated_bytes") or 0)
               + (pp.get("uncounted_bytes") or 0) >= failed):
        parts = [(p["part"], p.get("bytes")) for p in pp.get("parts") or ()
                 if p.get("bytes") is not None]
        return _peak("window", pp.get("allocated_bytes"), parts,
                     (window or {}).get("batch_size"), (window or {}).get("step"))
    if at_failure is not None:
        known = sum(v for _, v in recorded)
        parts = [*recorded, ("activations_and_temporaries", max(at_failure - known, 0))]
        if requested is not None:
            parts.append(("failed_request", requested))
        return _peak("failure", at_failure + (requested or 0), parts, batch_size, None)
    if history:
        h = max(history, key=lambda r: r["allocated_bytes"])
        known = sum(v for _, v in recorded)
        parts = [*recorded, ("activations_and_temporaries",
                             max(h["allocated_bytes"] - known, 0))]
        return _peak("iteration_peaks", h["allocated_bytes"], parts, h.get("batch_size"),
                     h.get("step"))
    return None


def _peak(source: str, total: int | None, parts: list[tuple[str, int | None]],
          batch_size: int | None, step: int | None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [{"part": k, "bytes": int(v or 0)} for k, v in parts]
    largest = max(rows, key=lambda r: r["bytes"], default=None)
    return {"source": source, "bytes": total, "batch_size": batch_size, "step": step,
            "parts": rows, "largest_part": largest["part"] if largest and largest["bytes"]
            else None}


class _Basis(NamedTuple):
    """What the prediction stands on: the bytes per sample, the bytes that do not grow with
    the batch, the allocator's packing (allocated / reserved at the measured peak: the share
    of its reserve it can fill), where they come from and whether they are measured."""

    per_sample: float
    fixed: float
    packing: float
    source: str
    bound: str


def _window_basis(window: dict[str, Any] | None) -> _Basis | None:
    """From the window's decomposed peak: activations and temporaries grow with the batch,
    the rest of that peak (parameters, the gradients and optimizer state live at it, what
    predates the window) does not; its reserved-but-unallocated bytes give the packing."""
    pp = (window or {}).get("peak_parts")
    wb = (window or {}).get("batch_size")
    if not pp or not wb or pp.get("allocated_bytes") is None:
        return None
    by = {p["part"]: p.get("bytes") or 0 for p in pp.get("parts") or ()}
    growing = by.get("activations", 0) + by.get("temporaries", 0)
    if growing <= 0:
        return None
    allocated = pp["allocated_bytes"]
    frag = (pp.get("fragmentation") or {}).get("bytes")
    packing = allocated / (allocated + frag) if frag is not None and allocated > 0 else 1.0
    total = allocated + (pp.get("uncounted_bytes") or 0)
    return _Basis(growing / wb, total - growing, packing, "window_peak", "measured")


def _per_sample(window: dict[str, Any] | None, history: Sequence[dict[str, Any]],
                fixed: dict[str, Any], at_failure: int | None, requested: int | None,
                batch_size: int | None, notes: list[str]) -> _Basis | None:
    """The basis of the prediction: of the measured peaks (the window's decomposition, the
    always-on per-iteration peaks beyond the steady fixed parts), the one that asks the most
    at the failing batch size; the failure's lower bound (the step needed at least what the
    allocator held and asked for) where it asks more (``bound``: ``"at_most"``)."""
    if not batch_size:
        notes.append("the batch size is not known (the hook reads it from the batches "
                      "prof.wrap() yields or the model's forward receives): no batch size "
                      "is predicted")
        return None
    measured = [b for b in [_window_basis(window)] if b is not None]
    for h in history:
        if h.get("batch_size") and h.get("allocated_bytes") is not None:
            measured.append(_Basis((h["allocated_bytes"] - fixed["total"]) / h["batch_size"],
                                   fixed["total"], 1.0, "iteration_peaks", "measured"))
    measured = [m for m in measured if m.per_sample > 0]
    lower = None
    if at_failure is not None:
        held_now = sum(v or 0 for v in fixed["held_now"].values())
        ps = (at_failure + (requested or 0) - held_now) / batch_size
        lower = _Basis(ps, fixed["total"], 1.0, "failure", "at_most") if ps > 0 else None
    if measured:
        best = max(measured, key=lambda b: b.fixed + b.per_sample * batch_size)
        if lower is not None and lower.per_sample > best.per_sample:
            return lower
        return best
    if lower is not None:
        notes.append("no peak was measured before the failure: the bytes per sample are a "
                      "lower bound (the step needed at least what the allocator held and "
                      "asked for), so the largest batch predicted is an upper bound; run a "
                      "few iterations at a smaller batch size first for a measured one")
    return lower


def _advice(state: dict[str, Any], fixed: dict[str, Any], basis: _Basis | None,
            batch_size: int | None, activations: float | None, demand: float | None,
            budget: float | None, requested: int | None,
            model: dict[str, Any] | None, autocast: str | None,
            notes: list[str]) -> list[dict[str, Any]]:
    """Each fix with its predicted saving at the failing batch size and whether the step
    would then fit (``fits``; None where the budget or the demand is not known)."""
    m = model or {}
    out: list[dict[str, Any]] = []

    def fits(saving: float) -> bool | None:
        if demand is None or budget is None:
            return None
        return demand - saving <= budget

    def add(fix: str, saving: float | None, detail: str, estimate: bool,
            **extra: Any) -> None:
        out.append({"fix": fix, "predicted_saving_bytes": None if saving is None
                    else round(saving), "fits": None if saving is None else fits(saving),
                    "estimate": estimate, "detail": detail, **extra})

    if basis is not None and batch_size and budget is not None:
        largest, detail = _largest_batch(basis, batch_size, budget, notes)
        add("batch_size", basis.per_sample * max(batch_size - largest, 0), detail,
            basis.bound == "at_most", largest_batch_size=largest, bound=basis.bound)
    layers = m.get("parametrized_modules") or 0
    if activations is not None and layers >= 4:
        kept = 2 * math.sqrt(layers) / layers
        add("activation_checkpointing", activations * (1 - kept),
            f"checkpointing every ~sqrt({layers}) of {layers} layers keeps about "
            f"{kept:.0%} of the activations (an estimate; recomputation costs about one "
            "more forward)", True)
    fp32 = set(m.get("parameter_dtypes") or ()) <= {"torch.float32"}
    if activations is not None and autocast in (None, "off", "float32") and fp32:
        add("bf16_autocast", activations / 2,
            "torch.autocast('cuda', dtype=torch.bfloat16): activations saved in BF16 take "
            "about half of FP32's (an estimate; the loop's autocast was "
            f"{'not seen' if autocast is None else 'off'})", True)
    frag = max(state.get("reserved_unallocated_bytes") or 0,
               state.get("inactive_split_bytes") or 0)
    if requested is not None and frag >= requested:
        add("expandable_segments", frag,
            f"{_gib(frag)} is reserved but unallocated (fragmented) and the failed request was "
            f"{_gib(requested)}: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the "
            "allocator grow segments instead of splitting them", False)
    opt_state = fixed["optimizer_state"]
    per_param = STATES_PER_PARAMETER.get(m.get("optimizer") or "")
    if opt_state and per_param == 2:
        add("optimizer_less_state", opt_state / 2,
            f"{m.get('optimizer')} keeps 2 states per parameter ({_gib(opt_state)}): SGD "
            "with momentum keeps 1", False,
            alternatives=[{"optimizer": "SGD(momentum)", "saving_bytes": round(opt_state / 2)},
                          {"optimizer": "8-bit Adam (bitsandbytes)",
                           "saving_bytes": round(opt_state * 3 / 4)}])
    out.sort(key=lambda a: -(a["predicted_saving_bytes"] or 0))
    return out


def _largest_batch(basis: _Basis, batch_size: int, usable: float, notes: list[str]
                   ) -> tuple[int, str]:
    """The largest batch whose predicted peak fits the usable budget (the budget at the
    allocator's packing), below the failing one, and the advice's text."""
    room = usable - basis.fixed
    largest = math.floor(room / basis.per_sample) if room > 0 else 0
    if largest >= batch_size:  # it failed at batch_size: not the batch's size alone
        if basis.bound == "measured":
            notes.append(f"the peak measured says batch size {batch_size} fits, yet it failed: "
                         "more than the batch grew (a longer input, a leak, fragmentation)")
        largest = batch_size - 1
    if largest < 1:
        notes.append(f"even a batch of one does not fit: the fixed parts alone are "
                     f"{_gib(basis.fixed)} of a usable {_gib(usable)}")
    packing = f" at the allocator's packing of {basis.packing:.0%}" if basis.packing < 1 else ""
    detail = (f"batch size {batch_size} -> {largest}: {_gib(basis.per_sample)} per sample "
              f"beyond the fixed {_gib(basis.fixed)} in a usable {_gib(usable)}{packing}"
              + (" (at most: the bytes per sample are a lower bound)"
                 if basis.bound == "at_most" else ""))
    return largest, detail


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def summary(report: dict[str, Any]) -> str:
    """One paragraph for the warning printed before the error propagates."""
    st = report["allocator"]
    bits = [f"tb_gpuprof: out of memory at iteration {report['step']}"
            f"{' on ' + report['device'] if report['device'] else ''}"]
    if st["allocated_bytes"] is not None:
        bits.append(f"allocated {_gib(st['allocated_bytes'])}"
                    + (f", reserved {_gib(st['reserved_bytes'])}"
                       if st["reserved_bytes"] is not None else ""))
    if report["largest_part"]:
        peak = report["last_peak"]
        part = next(p for p in peak["parts"] if p["part"] == report["largest_part"])
        bits.append(f"largest part at the last known peak ({peak['source']}): "
                    f"{report['largest_part']} {_gib(part['bytes'])}")
    for a in report["advice"][:3]:
        bits.append(f"{a['fix']}: saves {_gib(a['predicted_saving_bytes'] or 0)}"
                    + (f" (largest batch size that fits: {a['largest_batch_size']})"
                       if a["fix"] == "batch_size" else ""))
    return "; ".join(bits) + "."


__all__ = ["OOM_REPORT_VERSION", "STATES_PER_PARAMETER", "oom_report", "parse_message",
           "summary"]
