"""Kineto / ``torch.profiler`` Chrome-trace JSON -> :class:`Profile`.

A large trace (500 MB, a million events) must parse in seconds and in a fraction of its size in
memory, so the whole JSON tree is never built. Kineto writes one event per ``  {\\n ... \\n  },``
block; a raw newline can never sit inside a JSON string, so ``\\n<indent>},`` is always an event
boundary outside strings. We read (and gunzip) the file in blocks, cut each block at its last
boundary, and decode the batch with msgspec into one Struct per event category (tagged by
"cat") that declares only the fields we use of it; a batch those cannot take is decoded into
one plain Struct for every event.
A batch that decodes is proof that the cut was right; anything unexpected (a compact one-line
file, a different indentation, odd JSON) falls back to one full decode of the file - slower,
still correct. Errors name the file and the problem in one line (:class:`TraceReadError`).

A big uncompressed trace is read in two byte ranges at once where a second core is idle: this
process up to an event gap near the middle, a forked child (readers/forked.py) the rest, which
sends its model objects back as columns to be appended in file order (_read_in_two). Anything
that goes wrong there ends in the read in one, so results and errors are the same either way.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import gzip
import json
import os
import queue
import re
import sys
import threading
import zlib
from array import array
from collections.abc import Iterable, Iterator
from operator import attrgetter
from typing import Any, ClassVar, Union

import msgspec
import numpy as np

from ..errors import EmptyProfileError, TraceReadError
from ..model import (
    DATALOADER,
    KERNEL,
    MEMCPY,
    MEMSET,
    OPTIMIZER,
    STEP,
    USER,
    Annotation,
    CpuOp,
    DeviceInfo,
    GpuActivity,
    MemoryEvents,
    Profile,
    PythonCalls,
    RuntimeCall,
)
from . import forked

# Read/decompress granularity; one batch of events is about this big. Small enough that a
# batch's decoded structs (about its size again) are still in the CPU cache when the model loop
# reads them and when they are freed: 1 MB reads 136 MB in about 0.47 CPU s, 8 MB in 0.70.
BLOCK_BYTES = 1 << 20
MAX_PENDING_BYTES = 64 << 20  # no event boundary within this much text: not a list of events
GAP_SEARCH_BYTES = 64 << 10  # first window searched backwards for the last event gap
MAX_CUT_TRIES = 4  # candidate gaps tried per batch before the tolerant decode
HEADER_LIMIT_BYTES = 16 << 20  # "traceEvents" must start within this much of the file
TOLERANT_FALLBACK_LIMIT = 256 << 20  # stdlib json retry (non-strict) only below this size

# Header/trailer keys copied into Profile.metadata (both decode paths keep the same set).
META_KEYS = (
    "schemaVersion", "distributedInfo", "with_stack", "record_shapes", "with_flops",
    "with_modules", "profile_memory", "cuda_driver_version", "cuda_runtime_version",
    "cupti_version", "hip_runtime_version", "baseTimeNanoseconds", "displayTimeUnit",
    "trace_id", "traceName", "Framework", "roctracer_version", "deviceProperties",
)


class _OpArgs(msgspec.Struct, gc=False, frozen=True):
    """The arguments ops, kernels, copies and runtime calls carry (both structs below)."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    device: int | None = None
    stream: int | None = None
    correlation: int | None = None
    registers: int | None = msgspec.field(default=None, name="registers per thread")
    shared_mem: int | None = msgspec.field(default=None, name="shared memory")
    blocks_per_sm: float | None = msgspec.field(default=None, name="blocks per SM")
    occupancy: float | None = msgspec.field(default=None, name="est. achieved occupancy %")
    grid: tuple[int, ...] | None = None
    block: tuple[int, ...] | None = None
    bytes: int | None = None
    # Raw: shapes repeat across iterations; decoded once per distinct text (empty when absent)
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    flops: float | None = None
    call_stack: str | None = msgspec.field(default=None, name="Call stack")


class _Args(_OpArgs, gc=False, frozen=True):
    # allocator events ("[memory]"): only those carry these keys
    mem_bytes: int | None = msgspec.field(default=None, name="Bytes")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    addr: int | None = msgspec.field(default=None, name="Addr")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    name: Any = None  # thread_name / process_name metadata events


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    """The plain path's event: every category in one struct (the reference the fast path's
    structs below are tested against)."""

    # No "ph": the category tells what an event is; flows (s/f) and instants have none we use.
    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float = 0.0
    dur: float = 0.0
    args: _Args = _NO_ARGS  # shared: flows and metadata events have no args


# Category -> what we make of it; old Kineto spelled some categories differently.
(_CPU_OP, _PYTHON, _KERNEL, _MEMCPY, _MEMSET, _RUNTIME, _ANNOT, _GPU_ANNOT,
 _INSTANT) = range(9)
_CATEGORY = {
    "cpu_op": _CPU_OP, "operator": _CPU_OP, "Operator": _CPU_OP,
    "python_function": _PYTHON, "python": _PYTHON, "Python": _PYTHON,
    "kernel": _KERNEL, "Kernel": _KERNEL,
    "gpu_memcpy": _MEMCPY, "Memcpy": _MEMCPY,
    "gpu_memset": _MEMSET, "Memset": _MEMSET,
    "cuda_runtime": _RUNTIME, "cuda_driver": _RUNTIME, "Runtime": _RUNTIME,
    "user_annotation": _ANNOT, "gpu_user_annotation": _GPU_ANNOT,
    "cpu_instant_event": _INSTANT,  # "[memory]" allocator events, "[OutOfMemory]"
}
_SPAN_CATEGORY = "Trace"  # the profiler's window: the one other category the model reads


# --- the fast path's structs: one per category, tagged by "cat" ------------------------------
# Each declares only what the model loop reads of its category, in the order Kineto writes
# the keys (msgspec matches a key against the next field first). So a python_function event
# (a third of a trace) costs no args struct, no "cat" or "pid" object; a flow costs nothing.
# An event whose category is not listed, or that has none (the "M" metadata and a few "i"
# events at the end of a trace), fails the batch's validation: that batch is decoded again
# into _Event (see _BatchDecoder). Every class has its category as the class attribute
# ``cat``, so the plain loop (``_add_plain``) reads these structs as it reads _Event.


class _Tagged(msgspec.Struct, gc=False, tag_field="cat"):
    cat: ClassVar[str] = ""


class _OpEventArgs(msgspec.Struct, gc=False, frozen=True):
    external_id: int | None = msgspec.field(default=None, name="External id")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    flops: float | None = None
    call_stack: str | None = msgspec.field(default=None, name="Call stack")


class _RuntimeArgs(msgspec.Struct, gc=False, frozen=True):
    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None


class _CopyArgs(_RuntimeArgs, gc=False, frozen=True):
    # declared in Kineto's order: External id, device, stream, correlation, bytes
    external_id: int | None = msgspec.field(default=None, name="External id")
    device: int | None = None
    stream: int | None = None
    correlation: int | None = None
    bytes: int | None = None


class _KernelArgs(msgspec.Struct, gc=False, frozen=True):
    external_id: int | None = msgspec.field(default=None, name="External id")
    device: int | None = None
    stream: int | None = None
    correlation: int | None = None
    registers: int | None = msgspec.field(default=None, name="registers per thread")
    shared_mem: int | None = msgspec.field(default=None, name="shared memory")
    blocks_per_sm: float | None = msgspec.field(default=None, name="blocks per SM")
    grid: tuple[int, ...] | None = None
    block: tuple[int, ...] | None = None
    occupancy: float | None = msgspec.field(default=None, name="est. achieved occupancy %")


class _MemoryArgs(msgspec.Struct, gc=False, frozen=True):
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    mem_bytes: int | None = msgspec.field(default=None, name="Bytes")
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    addr: int | None = msgspec.field(default=None, name="Addr")


class _Timed(_Tagged):  # the fields every timed event has (not a category of its own)
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0


class _OnThread(_Timed):
    tid: int | str | None = None


class _OnDevice(_OnThread):
    pid: int | str | None = None


class _OpEvent(_OnThread, tag="cpu_op"):
    args: _OpEventArgs = _OpEventArgs()


class _PythonEvent(_OnThread, tag="python_function"):
    pass


class _RuntimeEvent(_OnThread, tag="cuda_runtime"):
    args: _RuntimeArgs = _RuntimeArgs()


class _KernelEvent(_OnDevice, tag="kernel"):
    args: _KernelArgs = _KernelArgs()


class _CopyEvent(_OnDevice, tag="gpu_memcpy"):
    args: _CopyArgs = _CopyArgs()


class _AnnotationEvent(_Timed, tag="user_annotation"):
    pass


class _InstantEvent(_Tagged, tag="cpu_instant_event"):
    name: str = ""
    tid: int | str | None = None
    ts: float = 0.0
    args: _MemoryArgs = _MemoryArgs()


class _SpanEvent(_Timed, tag=_SPAN_CATEGORY):  # the profiler's window
    pass


class _SkippedEvent(_Tagged):
    """A category the model does not use (flows, CUPTI overhead, ...): no fields at all."""


def _same_fields(base: type[_Tagged], tag: str) -> type[_Tagged]:
    """A struct like ``base`` for another category (an old spelling, a sibling kind)."""
    name = base.__name__ + "_" + re.sub(r"\W", "_", tag)
    cls: Any = msgspec.defstruct(name, [], bases=(base,), tag=tag, gc=False)
    cls.cat = tag
    return cls


# Categories the model loop ignores (any but _CATEGORY's and "Trace"): flows, Kineto's other
# activity kinds. One in neither list costs its batch a second decode, then is learnt.
_SKIPPED_CATEGORIES = (
    "ac2g", "fwdbwd", "overhead", "cuda_sync", "external_correlation", "cuda_profiler_range",
    "glow_runtime", "mtia_runtime", "mtia_ccp_events", "privateuse1_runtime",
    "privateuse1_driver", "xpu_runtime", "hpu_op", "collective_comm",
)
_STRUCT_OF_KIND: dict[int, type[_Tagged]] = {
    _CPU_OP: _OpEvent, _PYTHON: _PythonEvent, _KERNEL: _KernelEvent, _MEMCPY: _CopyEvent,
    _MEMSET: _CopyEvent, _RUNTIME: _RuntimeEvent, _ANNOT: _AnnotationEvent,
    _GPU_ANNOT: _AnnotationEvent, _INSTANT: _InstantEvent,
}
# One struct per spelling in _CATEGORY (the base class for the spelling it is tagged with)
_READ_TYPES: list[type[_Tagged]] = [_SpanEvent]
for _cat, _kind in _CATEGORY.items():
    _base = _STRUCT_OF_KIND[_kind]
    _base.cat = str(_base.__struct_config__.tag)
    _READ_TYPES.append(_base if _base.cat == _cat else _same_fields(_base, _cat))
_SpanEvent.cat = _SPAN_CATEGORY
# Old spellings of the two kinds the model loop handles itself (see add_events)
_RESPELT_TYPES = {t for t in _READ_TYPES if t not in (_OpEvent, _PythonEvent)
                  and issubclass(t, (_OpEvent, _PythonEvent))}
_skipped_types: dict[str, type[_Tagged]] = {}
_SKIPPED_TYPES: set[type] = set()  # every struct _skipped_type made: the model loop skips them


def _skipped_type(cat: str) -> type[_Tagged]:
    """The (cached) field-less struct for a category the model ignores."""
    cls = _skipped_types.get(cat)
    if cls is None:
        cls = _skipped_types[cat] = _same_fields(_SkippedEvent, cat)
        _SKIPPED_TYPES.add(cls)
    return cls



def _tagged_decoder(skipped: list[type[_Tagged]]) -> msgspec.json.Decoder[list[Any]]:
    union: Any = Union[tuple(_READ_TYPES + skipped)]  # noqa: UP007 (built at run time)
    return msgspec.json.Decoder(list[union], strict=False)


_TAGGED_DECODER = _tagged_decoder([_skipped_type(cat) for cat in _SKIPPED_CATEGORIES])


class _BatchDecoder:
    """Decodes one streamed batch into the tagged structs, else into plain _Event structs.

    A batch the tagged structs cannot take is decoded again plainly; the categories it held
    that no struct is tagged with become skipped structs from then on, so a new kind of event
    costs one batch. Events without a category cannot be tagged (Kineto writes its "M"
    events at the end, in one batch): once more than a quarter of the batches held some,
    the rest goes straight to _Event, so such a trace is decoded at most 1.25 times.
    """

    def __init__(self) -> None:
        # what _TAGGED_DECODER skips (_skipped_types may hold what other reads learnt)
        self._skipped = {cat: _skipped_type(cat) for cat in _SKIPPED_CATEGORIES}
        self._tagged: msgspec.json.Decoder[list[Any]] | None = _TAGGED_DECODER
        self._batches = self._untagged = 0

    def decode(self, batch: memoryview) -> list[Any]:
        """The batch's events; msgspec.DecodeError as the plain decoder raises it."""
        self._batches += 1
        if self._tagged is not None:
            try:
                return self._tagged.decode(batch)
            except msgspec.ValidationError:
                pass
        events: list[_Event] = _EVENTS_DECODER.decode(batch)
        if self._tagged is not None:
            self._learn({ev.cat for ev in events})
        return events

    def _learn(self, categories: set[str]) -> None:
        known = _CATEGORY.keys() | self._skipped.keys() | {_SPAN_CATEGORY, ""}
        new = categories - known
        for cat in new:
            self._skipped[cat] = _skipped_type(cat)
        if new:
            self._tagged = _tagged_decoder(list(self._skipped.values()))
        if "" in categories or not new:
            self._untagged += 1
            if self._untagged >= 2 and 4 * self._untagged > self._batches:
                self._tagged = None


_EventList = list[_Event]
_TraceObject = msgspec.defstruct(
    "_TraceObject",
    [("traceEvents", _EventList)] + [(k, Any, None) for k in META_KEYS],
    gc=False,
)
_EVENTS_DECODER = msgspec.json.Decoder(_EventList, strict=False)
_FULL_DECODER = msgspec.json.Decoder(_TraceObject | _EventList, strict=False)
_HEADER_DECODER = msgspec.json.Decoder(dict[str, Any])
_TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENT_GAP = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")  # between two events, any layout
_FIRST_KEY = re.compile(rb'[ \t\r\n]*\{[ \t\r\n]*("[^"\\]{1,64})"[ \t\r\n]*:')

_MISSING = object()
# Ops whose scalar arguments ("Concrete Inputs") FLOPs need: conv geometry, attention's causal
# flag (tb_gpuprof/analysis/flops.py).
_CONCRETE_OPS = ("aten::conv", "aten::_conv", "aten::cudnn_conv", "aten::scaled_dot_product",
                 "aten::_scaled_dot_product", "aten::_flash_attention",
                 "aten::_efficient_attention", "aten::_cudnn_attention")
_STEP_MARKER = "ProfilerStep#"  # sentinel (by identity) in the op-name cache
_STEP_NUMBER = re.compile(r"#(\d+)\s*$")


def classify_annotation(name: str) -> tuple[str, int | None]:
    """Annotation kind and iteration number for a Kineto/NVTX range name."""
    if name.startswith("ProfilerStep#"):
        m = _STEP_NUMBER.search(name)
        return STEP, int(m.group(1)) if m else None
    if name.startswith("Optimizer.step#"):
        return OPTIMIZER, None
    if name.startswith("enumerate(DataLoader)#"):
        return DATALOADER, None
    return USER, None  # Optimizer.zero_grad#..., record_function ranges


class _LayoutMismatch(Exception):
    """The fast path met something it does not handle; decode the whole file instead."""


def read_kineto(path: str | os.PathLike[str], python_calls: bool = True) -> Profile:
    """Read a torch.profiler/Kineto Chrome trace: ``.json``/``.json.gz``, object or bare list.

    ``python_calls=False``: no ``Profile.python`` (the Timeline's Python rows), which no
    analysis reads; user-code frames still give the ops their stacks. A big uncompressed
    trace is decoded in two byte ranges at once (a forked child takes the second), where
    that is safe (:func:`forked.can_fork`); the profile is the same either way."""
    path = os.fspath(path)
    profile = _read_in_two(path, python_calls) if _worth_splitting(path) else None
    return profile if profile is not None else _read_in_one(path, python_calls)


def _read_in_one(path: str, python_calls: bool) -> Profile:
    builder = _ProfileBuilder(path, python_calls)
    try:
        _stream_decode(path, builder)
        streamed = True
    except _LayoutMismatch:
        streamed = False
    if not streamed:  # outside the except: its traceback (and open reader) is gone
        builder = _ProfileBuilder(path, python_calls)
        _full_decode(path, builder)
    return builder.finish()


# --- reading ---------------------------------------------------------------------------------


def _is_gzip(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x1f\x8b"
    except FileNotFoundError:
        raise TraceReadError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceReadError(path, "is a directory, not a trace file") from None
    except OSError as e:
        raise TraceReadError(path, f"cannot read: {e.strerror or e}") from None


def _blocks(path: str) -> Iterator[bytes]:
    """The file's (decompressed) bytes in blocks; gzip damage becomes a TraceReadError.

    zlib releases the GIL, so a gzip file is decompressed by a helper thread one block ahead
    of the decoder: on two cores decompression then costs almost no wall time.
    """
    if _is_gzip(path):
        return _read_ahead(_raw_blocks(path, gzip.open))
    return _raw_blocks(path, open)


def _raw_blocks(path: str, opener: Any, start: int = 0,
                stop: int | None = None) -> Iterator[bytes]:
    """Bytes ``start`` to ``stop`` (None: the end) in blocks; ranges only of a plain file."""
    try:
        with opener(path, "rb") as f:
            if start:
                f.seek(start)
            left = sys.maxsize if stop is None else stop - start
            while block := f.read(min(BLOCK_BYTES, left)):
                left -= len(block)
                yield block
    except EOFError:
        raise TraceReadError(path, "truncated gzip file (compressed stream ends early)") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise TraceReadError(path, f"corrupt gzip data: {e}") from None
    except OSError as e:
        raise TraceReadError(path, f"cannot read: {e.strerror or e}") from None


_END = object()


def _read_ahead(blocks: Iterator[bytes], depth: int = 2) -> Iterator[bytes]:
    """Yield ``blocks`` produced on a helper thread; errors re-raised here, never lost."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False  # the consumer is gone (it failed or fell back)

    def produce() -> None:
        try:
            for block in blocks:
                if not put(block):
                    return
            put(_END)
        except BaseException as e:  # handed to the consumer thread
            put(e)
        finally:
            blocks.close()  # type: ignore[attr-defined]

    worker = threading.Thread(target=produce, name="tb_gpuprof-gunzip", daemon=True)
    worker.start()
    try:
        while (item := q.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()


def _stream_decode(path: str, builder: _ProfileBuilder) -> None:
    it = _blocks(path)
    head, is_list, events_at = _find_events(path, it, builder)
    window = _stream_events(memoryview(head)[events_at - 1 :], it, builder)
    _decode_tail(path, window.buf[: window.n], is_list, builder)


def _stream_events(text: memoryview, blocks: Iterator[bytes],
                   builder: _ProfileBuilder) -> _Buffer:
    """Decode the events of ``text`` and ``blocks`` (the byte before the first event, then
    the rest) up to the last event gap; return the window holding what follows it."""
    # buf[0] is always the byte before the next event: the array's "[" at first, then the ","
    # after the last cut. Overwriting it with "[" and the cut's "," with "]" turns a prefix of
    # the buffer into a JSON array in place, decoded through a memoryview: no copies.
    # The text is buf[:n]; buf itself never changes size (see _Buffer).
    window = _Buffer(text)
    del text
    gap: re.Pattern[bytes] | None = None
    decoder = _BatchDecoder()
    while True:
        if gap is None:
            gap = _gap_pattern(window.buf, window.n)
        comma = _decode_prefix(window, builder, decoder, gap) if gap is not None else 0
        if comma > 0:
            window.drop(comma)
        elif gap is not _EVENT_GAP and gap is not None and window.n > MAX_PENDING_BYTES // 2:
            gap = _EVENT_GAP  # the events do not all start with the first one's key
        elif window.n > MAX_PENDING_BYTES:
            raise _LayoutMismatch  # no event boundary in 64 MB: not a list of events
        block = next(blocks, None)
        if block is None:
            return window
        window.append(block)


class _Buffer:
    """The text not decoded yet, ``buf[:n]``, in a bytearray that is never resized.

    Moving a bytearray's start (``del buf[:k]``) and appending the next block reallocates it
    on every batch, and the fresh memory costs a page fault per 4 KB (136 MB: about 25 k
    faults, 0.05 s of system time, as much as reading the file). A fixed buffer is written in
    place instead; it is replaced by a bigger one only when an event outgrows it. That also
    keeps a view outliving its batch harmless: a Dask worker's sampling profiler can hold a
    frame of the decode, and with it Raw views into the buffer, which would forbid a resize.
    """

    def __init__(self, text: memoryview) -> None:
        self.n = len(text)
        self.buf = bytearray(self.n + 2 * BLOCK_BYTES)
        self.buf[: self.n] = text

    def drop(self, k: int) -> None:
        """Forget the first ``k`` bytes: the rest (about one event) moves to the front."""
        rest = self.n - k
        self.buf[:rest] = self.buf[k : self.n]  # the right side is a copy: no overlap
        self.n = rest

    def append(self, block: bytes) -> None:
        end = self.n + len(block)
        if end > len(self.buf):
            bigger = bytearray(max(2 * len(self.buf), end + BLOCK_BYTES))
            bigger[: self.n] = memoryview(self.buf)[: self.n]
            self.buf = bigger  # the old one is left to whatever still views it
        self.buf[self.n : end] = block
        self.n = end


def _find_events(path: str, it: Iterator[bytes],
                 builder: _ProfileBuilder) -> tuple[bytes, bool, int]:
    """Read up to the start of the event list: (text so far, bare list?, index after "[")."""
    buf = b""
    for block in it:
        buf = block if not buf else buf + block
        start = buf.lstrip()[:1]
        if start == b"[":
            return buf, True, buf.index(b"[") + 1
        if start == b"{":
            m = _TRACE_EVENTS_KEY.search(buf)
            if m:
                try:
                    header = _HEADER_DECODER.decode(buf[: m.end()] + b"]}")
                except msgspec.DecodeError:
                    raise _LayoutMismatch from None  # "traceEvents" not at the top level
                builder.add_metadata(header)
                return buf, False, m.end()
            if len(buf) > HEADER_LIMIT_BYTES:
                raise _LayoutMismatch
            continue
        if start:
            raise _LayoutMismatch  # not JSON we know: the full decode names the problem
    if not buf.strip():
        raise TraceReadError(path, "empty file")
    raise _LayoutMismatch


def _gap_pattern(buf: bytes | bytearray, n: int) -> re.Pattern[bytes] | None:
    """The gap between two events, once the first event's first key is in the buffer.

    ``}, {`` alone also occurs between objects nested in an event (and inside strings); a
    producer starts every event with the same key ("ph" for Kineto), so the gap followed by
    that key is nearly always a real boundary. None until the first key has arrived.
    """
    m = _FIRST_KEY.match(buf, 1, n)
    if m is None:
        if n > 4096 or buf[1:n].strip(b" \t\r\n")[:1] not in (b"", b"{"):
            return _EVENT_GAP  # no key within reach (empty list, odd text): try the plain gap
        return None
    return re.compile(_EVENT_GAP.pattern + rb"[ \t\r\n]*" + re.escape(m.group(1)) + rb'"')


def _last_gap(buf: bytearray, end: int, gap: re.Pattern[bytes]) -> int:
    """Index of the "," of the last ``}<space>,<space>{`` lying before ``end``; -1 if none.

    Searches backwards in growing windows, so finding the usual gap near the end of a batch
    costs one small regex scan, whatever the layout (one line, any indentation).
    """
    window = GAP_SEARCH_BYTES
    lo = end
    while lo > 1:
        lo = max(1, lo - window)
        last = collections.deque(gap.finditer(buf, lo, end), maxlen=1)
        if last:
            return buf.index(b",", last[0].start())
        window *= 2
    return -1


def _decode_prefix(window: _Buffer, builder: _ProfileBuilder, decoder: _BatchDecoder,
                   gap: re.Pattern[bytes]) -> int:
    """Decode the events before the buffer's last event gap; return that gap's index (or 0).

    A gap found by pattern may sit inside a string or a nested list of objects; the batch up
    to it is then unbalanced JSON, which msgspec rejects, so we try the gap before it. A batch
    that decodes is proof that its cut was right.
    """
    buf, end = window.buf, window.n
    first = -1
    for _ in range(MAX_CUT_TRIES):
        comma = _last_gap(buf, end, gap)
        if comma < 0:
            break
        first = comma if first < 0 else first
        buf[0], buf[comma] = 0x5B, 0x5D  # "[", "]"
        with memoryview(buf) as whole:
            batch = whole[: comma + 1]
            events: list[Any] | None
            try:
                events = decoder.decode(batch)
            except msgspec.DecodeError:
                events = None
            decoded = events is not None
            if events is not None:
                builder.add_events(events)
            del events  # with it, as a rule, every Raw view into the buffer
            with contextlib.suppress(BufferError):  # a view held elsewhere (see _Buffer)
                batch.release()
        if decoded:
            return comma
        buf[comma] = 0x2C  # ","; try the gap before
        end = comma
    if first < 0:
        return 0
    # No cut decodes strictly: Kineto's own defects (raw control characters, bare N/A).
    buf[0], buf[first] = 0x5B, 0x5D
    builder.add_events(_decode_batch(bytes(buf[: first + 1])))
    return first


def _decode_tail(path: str, buf: bytearray, is_list: bool, builder: _ProfileBuilder) -> None:
    """The rest: last events plus whatever follows the array (e.g. "traceName")."""
    buf[0] = 0x5B
    if is_list:
        builder.add_events(_decode_batch(bytes(buf), path=path))
        return
    try:
        tail = _FULL_DECODER.decode(b'{"traceEvents":' + buf)
    except msgspec.DecodeError as e:
        if "truncated" in str(e):
            raise TraceReadError(path, "truncated JSON (the file ends mid-way)") from None
        raise _LayoutMismatch from None
    builder.add_events(tail.traceEvents)
    builder.add_metadata({k: getattr(tail, k) for k in META_KEYS})


def _decode_batch(data: bytes | memoryview, path: str | None = None) -> list[_Event]:
    try:
        return _EVENTS_DECODER.decode(data)
    except msgspec.DecodeError as e:
        if path is not None and "truncated" in str(e):
            raise TraceReadError(path, "truncated JSON (the file ends mid-way)") from None
        if len(data) < TOLERANT_FALLBACK_LIMIT:
            tolerant = _tolerant_json(bytes(data))
            if isinstance(tolerant, list):
                try:  # re-encoded, it is plain JSON our typed decoder takes
                    return _EVENTS_DECODER.decode(msgspec.json.encode(tolerant))
                except msgspec.DecodeError:
                    pass
        raise _LayoutMismatch from None


def _tolerant_json(data: bytes) -> Any:
    """What torch-tb-profiler accepts too: raw control characters in strings, bare N/A."""
    try:
        text = data.decode("utf-8", errors="replace")
        try:
            return json.loads(text, strict=False)
        except json.JSONDecodeError:
            return json.loads(re.sub(r'(?<!")N/A(?!")', '"N/A"', text), strict=False)
    except (json.JSONDecodeError, RecursionError):
        return None


def _full_decode(path: str, builder: _ProfileBuilder) -> None:
    data = b"".join(_blocks(path))
    if not data.strip():
        raise TraceReadError(path, "empty file")
    try:
        doc = _FULL_DECODER.decode(data)
    except msgspec.ValidationError as e:
        raise _not_a_trace(path, str(e)) from None
    except msgspec.DecodeError as e:
        if "truncated" in str(e):
            raise TraceReadError(path, "truncated JSON (the file ends mid-way)") from None
        tolerant = _tolerant_json(data) if len(data) < TOLERANT_FALLBACK_LIMIT else None
        if tolerant is None:
            raise TraceReadError(path, f"not valid JSON: {e}") from None
        try:
            doc = _FULL_DECODER.decode(msgspec.json.encode(tolerant))
        except msgspec.DecodeError as e2:
            raise _not_a_trace(path, str(e2)) from None
    del data
    if isinstance(doc, list):
        builder.add_events(doc)
    else:
        builder.add_metadata({k: getattr(doc, k) for k in META_KEYS})
        builder.add_events(doc.traceEvents)


def _not_a_trace(path: str, detail: str) -> TraceReadError:
    if "traceEvents" in detail and "missing" in detail:
        return TraceReadError(path, "JSON but not a Chrome trace: no 'traceEvents' list")
    if detail.startswith("Expected `object | array`"):
        return TraceReadError(path, "JSON but not a Chrome trace: top level is no object or list")
    return TraceReadError(path, f"JSON but not a Kineto trace: {detail}")


# --- two byte ranges at once -----------------------------------------------------------------

SPLIT_MIN_BYTES = 32 << 20  # below this a second process saves less than it costs
SPLIT_AT = 0.55  # the share of the event list this process decodes (it also merges the rest)
CUT_SEARCH_BYTES = 1 << 20  # how far past the split point an event gap is looked for


def _worth_splitting(path: str) -> bool:
    try:
        size = os.path.getsize(path)
    except OSError:
        return False  # the read in one names the problem
    return size >= SPLIT_MIN_BYTES and forked.can_fork() and not _is_gzip(path)


def _read_in_two(path: str, python_calls: bool) -> Profile | None:
    """Decode up to an event gap near the middle here and the rest in a forked child.

    None where there is no such gap or either part fails to decode; the file is then read
    in one, which also names any problem as it always does. An error of this process's
    part is raised as is: the read in one would meet it at the same place.
    """
    builder = _ProfileBuilder(path, python_calls)
    blocks = _blocks(path)
    try:
        head, is_list, events_at = _find_events(path, blocks, builder)
    except _LayoutMismatch:
        return None
    finally:
        blocks.close()  # type: ignore[attr-defined]
    cut = _split_point(path, head, events_at)
    if cut is None:
        return None
    try:
        with forked.ForkedJob(_read_from, path, cut, is_list, python_calls) as child:
            # the same blocks as the read in one: the batches and their decoding are too
            window = _stream_events(memoryview(head)[events_at - 1 :],
                                    _raw_blocks(path, open, len(head), cut), builder)
            _decode_to_cut(window, builder)
            builder.merge(child.results())
    except (_LayoutMismatch, forked.ChildFailed):
        return None
    return builder.finish()


def _split_point(path: str, head: bytes, events_at: int) -> int | None:
    """File offset of a "," between two events about SPLIT_AT into the event list.

    Only a gap followed by the key every event starts with: that cannot lie in a string, and
    one between objects nested in an event leaves the part before it unbalanced, which its
    decode (_decode_to_cut) refuses.
    """
    gap = _gap_pattern(head[events_at - 1 :], len(head) - events_at + 1)
    if gap is None or gap is _EVENT_GAP:
        return None
    start = max(len(head), events_at + int((os.path.getsize(path) - events_at) * SPLIT_AT))
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read(CUT_SEARCH_BYTES)
    except OSError:
        return None
    m = gap.search(text)
    return None if m is None else start + text.index(b",", m.start())


def _decode_to_cut(window: _Buffer, builder: _ProfileBuilder) -> None:
    """This process's last events: the window (it ends just before the cut) as one array."""
    window.append(b"]")
    window.buf[0] = 0x5B  # "["
    builder.add_events(_decode_batch(bytes(window.buf[: window.n])))


def _read_from(path: str, cut: int, is_list: bool, python_calls: bool) -> Iterator[Any]:
    """The child's part: the events after the cut and what follows the list, as frames."""
    builder = _ProfileBuilder(path, python_calls)
    blocks = _raw_blocks(path, open, cut)
    window = _stream_events(memoryview(next(blocks, b"")), blocks, builder)
    _decode_tail(path, window.buf[: window.n], is_list, builder)
    return builder.export()


# --- python stacks ----------------------------------------------------------------------------

MAX_STACK_FRAMES = 5  # the deepest user frames are the ones a user acts on
# Top-level packages whose frames are library code, not the user's (Kineto strips sys.path
# prefixes, so a frame reads "torch/nn/modules/module.py(1783): _call_impl").
_LIBRARY_ROOTS = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "functorch", "triton", "numpy",
    "transformers", "accelerate", "apex", "deepspeed", "lightning", "pytorch_lightning",
    "lightning_fabric", "timm", "einops", "megatron", "fairscale", "xformers", "flash_attn",
    "tensorboard", "tqdm", "hydra", "omegaconf", "datasets", "safetensors", "peft",
    "diffusers", "torchmetrics", "jax", "tensorflow", "keras", "_pytest", "pytest", "pluggy",
    "IPython", "ipykernel", "tb_gpuprof",
}) | frozenset(sys.stdlib_module_names)


def is_user_frame(frame: str) -> bool:
    """True for "train.py(53): step"; False for built-ins, nn.Module markers, library/stdlib."""
    if frame.startswith(("<", "nn.Module")):
        return False
    file = frame.split("(", 1)[0].replace("\\", "/")
    if "-packages/" in file or "/lib/python" in file:
        return False
    root = file.lstrip("/").split("/", 1)[0]
    return root.removesuffix(".py") not in _LIBRARY_ROOTS


class UserStackBuilder:
    """Gives each CPU op the user frames that enclose it, from Kineto's python_function events.

    Frames are kept only when they are user code (a dict lookup per event), then one sweep per
    thread over frames and ops, both sorted by start, assigns the open frames to each op.
    Ops under the same frames share one list. Stacks read innermost frame first.
    """

    def __init__(self) -> None:
        # Filled by the reader's loop directly (it is hot): tid -> [(start, end, frame)].
        self.frames: dict[Any, list[tuple[float, float, str]]] = {}
        self._call_stacks: dict[str, list[str] | None] = {}

    def from_call_stack(self, text: str) -> list[str] | None:
        """Old torch wrote the stack as one "Call stack" argument, innermost first."""
        if text not in self._call_stacks:
            frames = [f for f in text.split(";") if f and is_user_frame(f)]
            self._call_stacks[text] = frames[:MAX_STACK_FRAMES] or None
        return self._call_stacks[text]

    def attach(self, ops: list[CpuOp]) -> None:
        """``ops`` sorted by start; sets ``stack`` where it is still None."""
        if not self.frames:
            return
        if len(self.frames) <= 4:  # one pass per thread is faster than one bucketing loop
            ops_by_tid = {tid: [op for op in ops if op.tid == tid and op.stack is None]
                          for tid in self.frames}
        else:
            ops_by_tid = {tid: [] for tid in self.frames}
            for op in ops:
                bucket = ops_by_tid.get(op.tid)
                if bucket is not None and op.stack is None:
                    bucket.append(op)
        for tid, frames in self.frames.items():
            frames.sort(key=lambda f: (f[0], -f[1]))  # parents before children at equal start
            _sweep(frames, ops_by_tid[tid])


def _sweep(frames: list[tuple[float, float, str]], ops: list[CpuOp]) -> None:
    """Give each op (sorted by start) the frames open at its start, innermost first.

    The open frames change only at an op that starts at or after the next frame's start or
    after the innermost open frame's end; the ops before it share the stack, so they are
    found by bisection and given it in one slice (no Python step per op). A NaN start makes
    the bisection meaningless: then every op is its own step, as the loop always was.
    """
    starts = [op.start_us for op in ops]
    jump = not any(t != t for t in starts)
    open_frames: list[tuple[float, str]] = []  # (end, name), innermost last
    current: list[str] | None = None
    i, n, j, m = 0, len(frames), 0, len(ops)
    while j < m:
        t = starts[j]
        changed = False
        while i < n and frames[i][0] <= t:
            start, end, name = frames[i]
            i += 1
            while open_frames and open_frames[-1][0] <= start:
                open_frames.pop()
            open_frames.append((end, name))
            changed = True
        while open_frames and open_frames[-1][0] < t:
            open_frames.pop()
            changed = True
        if changed:
            top = open_frames[-MAX_STACK_FRAMES:]
            current = [name for _, name in reversed(top)] or None
        k = j + 1
        if jump:  # the first op after j at which a frame opens or the innermost one closes
            if i < n:
                k = bisect.bisect_left(starts, frames[i][0], k)
            else:
                k = m
            if open_frames:
                k = min(k, bisect.bisect_right(starts, open_frames[-1][0], j + 1))
        if current is not None:  # the others' stack is None already
            for op in ops[j:k]:
                op.stack = current
        j = k


# --- allocator events and Python calls ---------------------------------------------------------


class MemoryEventsBuilder:
    """Collects ``[memory]`` instant events into :class:`MemoryEvents` (compact arrays). The
    reader's loop calls :meth:`add` only for instant events, so traces without them pay
    nothing per event."""

    def __init__(self) -> None:
        self.series = MemoryEvents()

    def add(self, ev: _Event) -> None:
        a = ev.args
        if a.mem_bytes is None or a.total_allocated is None:
            return  # not an allocator event we can use
        m = self.series
        m.ts.append(ev.ts)
        m.nbytes.append(a.mem_bytes)
        m.allocated.append(a.total_allocated)
        m.reserved.append(a.total_reserved if a.total_reserved is not None else -1)
        m.addr.append(a.addr or 0)
        m.device_type.append(max(min(a.device_type if a.device_type is not None else 0, 127), -1))
        m.device_id.append(max(min(a.device_id if a.device_id is not None else -1, 127), -1))
        m.tid.append(ev.tid if type(ev.tid) is int else 0)

    def finish(self) -> MemoryEvents | None:
        m = self.series
        if not len(m):
            return None
        ts = m.ts
        if _out_of_order(ts):  # Kineto writes them in order
            order = sorted(range(len(ts)), key=ts.__getitem__)
            for name in MemoryEvents.__slots__:
                col = getattr(m, name)
                setattr(m, name, type(col)(col.typecode, (col[i] for i in order)))
        return m


def _out_of_order(values: array) -> bool:
    """Some value is greater than the next (what ``any(v[i] > v[i + 1])`` says, NaN
    included: it compares False either way), in numpy: no Python float per value."""
    col = np.frombuffer(values, np.float64) if len(values) else np.empty(0)
    return bool((col[1:] < col[:-1]).any())


class PythonCallsBuilder:
    """``python_function`` events as :class:`PythonCalls` (the Timeline's Python rows),
    sorted by start at the end."""

    def __init__(self) -> None:
        self.calls = PythonCalls()  # appended to by the reader's loop directly (it is hot)

    def finish(self) -> PythonCalls | None:
        c = self.calls
        if not len(c):
            return None
        start = c.start
        if _out_of_order(start):
            order = sorted(range(len(start)), key=start.__getitem__)
            c.start = array("d", (start[i] for i in order))
            c.dur = array("d", (c.dur[i] for i in order))
            c.tid = array("q", (c.tid[i] for i in order))
            c.name = [c.name[i] for i in order]
        return c


# --- building the model -----------------------------------------------------------------------


class _OpName:
    """What the fast path knows of one op name: the canonical (interned) name, whether
    FLOPs need its concrete inputs, and the argument texts seen with it, as Raw copies with
    their decoded values. An op's shapes and types are found by comparing its texts with
    these (a memcmp each): a name has a few distinct shapes, and a dict would first copy and
    hash both texts (about 0.4 us an op)."""

    LIMIT = 16  # texts kept per name and argument
    __slots__ = ("conv", "dims", "name", "shapes", "type_texts", "types")

    def __init__(self, name: str, conv: bool) -> None:
        self.name = name
        self.conv = conv
        self.dims: list[msgspec.Raw] = []
        self.shapes: list[Any] = []
        self.type_texts: list[msgspec.Raw] = []
        self.types: list[Any] = []


FRAME_ITEMS = 1 << 17  # model objects per exported frame: bounds the columns held at once
_MODEL_LISTS = {"cpu_ops": CpuOp, "gpu": GpuActivity, "runtime": RuntimeCall,
                "annotations": Annotation}  # Profile's lists of objects, by attribute
_REST = "rest"  # the last frame: everything but those lists


class _ProfileBuilder:
    """Turns decoded events into model objects, batch by batch, sharing repeated values."""

    def __init__(self, path: str, python_calls: bool = True) -> None:
        self.profile = Profile(source=path, format="kineto")
        self.python_calls = python_calls  # keep the Timeline's Python rows (read_kineto)
        self.stacks = UserStackBuilder()
        self._json_cache: dict[bytes, Any] = {}
        self._op_names: dict[str, str] = {}  # interns op names, flags step markers
        self._conv_ops: set[str] = set()  # op names whose concrete inputs FLOPs need
        self._op_infos: dict[str, _OpName] = {}  # the same for the fast path, and more
        # One int object per thread id: msgspec makes a new one per event (ids are > 256)
        self._threads: dict[Any, int] = {}
        self._dims_cache: dict[tuple[int, ...], tuple[int, int, int]] = {}
        self._thread_names: dict[str, str] = {}
        # python_function name -> (the interned name, is it user code): one lookup per call
        self._python_frames: dict[str, tuple[str, bool]] = {}
        self._library_frames: dict[str, str] = {}  # the same for names that are not user code
        self._events = 0
        self.memory = MemoryEventsBuilder()
        self.python = PythonCallsBuilder()

    def add_metadata(self, doc: dict[str, Any]) -> None:
        meta = self.profile.metadata
        for key in META_KEYS:
            value = doc.get(key)
            if value is None:
                continue
            if key == "deviceProperties":
                self._add_devices(value)
            elif key == "distributedInfo" and isinstance(value, dict):
                meta["distributed"] = {k: value.get(k) for k in
                                       ("rank", "world_size", "backend", "nccl_version")
                                       if k in value}
            else:
                meta[key] = value

    def _add_devices(self, props: Any) -> None:
        if not isinstance(props, list):
            return
        for p in props:
            if not isinstance(p, dict) or not isinstance(p.get("id"), int):
                continue
            self.profile.devices.append(DeviceInfo(
                id=p["id"], name=str(p.get("name", "")),
                compute_major=p.get("computeMajor"), compute_minor=p.get("computeMinor"),
                num_sms=p.get("numSms"), total_memory=p.get("totalGlobalMem")))

    def _thread(self, tid: Any) -> int:
        value = self._threads[tid] = tid if type(tid) is int else 0
        return value

    def _learn_op_name(self, name: str) -> str:
        canonical = _STEP_MARKER if name.startswith("ProfilerStep#") else sys.intern(name)
        self._op_names[name] = canonical
        if canonical.startswith(_CONCRETE_OPS):
            self._conv_ops.add(canonical)
        return canonical

    def _learn_op_info(self, name: str) -> _OpName:
        canonical = self._learn_op_name(name)
        info = self._op_infos[name] = _OpName(canonical, canonical in self._conv_ops)
        return info

    def _json_value(self, raw: msgspec.Raw) -> Any:
        key = bytes(raw)
        value = self._json_cache.get(key, _MISSING)
        return self._decode_new(key) if value is _MISSING else value

    def _learn_arguments(self, info: _OpName, a: _OpEventArgs) -> tuple[Any, Any]:
        """An op's shapes and types whose texts ``info`` does not hold yet (it keeps up to
        _OpName.LIMIT of each: past that, a name with ever new shapes costs a hash a text)."""
        shapes, types = self._json_value(a.input_dims), self._json_value(a.input_type)
        if a.input_dims not in info.dims and len(info.dims) < _OpName.LIMIT:
            info.dims.append(a.input_dims.copy())  # a copy: the batch's buffer is reused
            info.shapes.append(shapes)
        if a.input_type not in info.type_texts and len(info.type_texts) < _OpName.LIMIT:
            info.type_texts.append(a.input_type.copy())
            info.types.append(types)
        return shapes, types

    def _learn_python_frame(self, name: str) -> tuple[str, bool]:
        name = sys.intern(name)
        frame = self._python_frames[name] = (name, is_user_frame(name))
        if not frame[1]:
            self._library_frames[name] = name
        return frame

    def _decode_new(self, key: bytes) -> Any:
        """First sight of an argument's JSON text; identical texts then share the value."""
        try:
            value = msgspec.json.decode(key)
        except msgspec.DecodeError:
            value = None
        self._json_cache[key] = value
        return value

    def _dims(self, dims: tuple[int, ...] | None) -> tuple[int, int, int] | None:
        if not dims:
            return None
        key = tuple(dims)
        cached = self._dims_cache.get(key)
        if cached is None:
            x, y, z = (*key, 1, 1, 1)[:3]
            cached = self._dims_cache[key] = (x, y, z)
        return cached

    def add_events(self, events: list[Any]) -> None:
        """One batch: the fast path's tagged structs, or plain _Event structs, or a mix.

        The hot loop of the reader: CPU ops and Python calls (three quarters of what a trace
        holds) are handled here, told apart by their struct's type; skipped categories cost
        one set lookup. Everything else (and every plain _Event) goes through _add_plain in
        its order, as do step markers written as CPU ops, so annotations keep the file's
        order; an op or a call under an old category spelling also goes there, once what
        waits before it has, so that ops and calls keep it too (the model's lists are sorted
        by start, stably: ties stay in file order). Locals for everything, one constructor
        call per object.
        """
        self._events += len(events)
        cpu_ops = self.profile.cpu_ops
        op_info = self._op_infos.get
        from_call_stack = self.stacks.from_call_stack
        thread = self._threads.get
        library_frame = self._library_frames.get
        py = self.python.calls  # Python rows of the Timeline: every call, user code or not
        py_start, py_dur, py_tid, py_name = (py.start.append, py.dur.append, py.tid.append,
                                             py.name.append)
        skipped, respell = _SKIPPED_TYPES, _RESPELT_TYPES
        keep_python = self.python_calls
        rest: list[Any] = []
        for ev in events:
            t = type(ev)
            if t is _OpEvent:
                info = op_info(ev.name)
                if info is None:  # first sight of this name
                    info = self._learn_op_info(ev.name)
                name = info.name
                if name is _STEP_MARKER:  # older torch: ProfilerStep#N as a cpu_op
                    rest.append(ev)
                    continue
                a = ev.args
                if a.input_dims:
                    try:  # texts seen with this name before: compared, not hashed
                        shapes = info.shapes[info.dims.index(a.input_dims)]
                        types = info.types[info.type_texts.index(a.input_type)]
                    except ValueError:
                        shapes, types = self._learn_arguments(info, a)
                    # stride/padding/... and is_causal for FLOPs; only math ops need them
                    concrete = self._json_value(a.concrete) if info.conv and a.concrete else None
                else:
                    shapes = types = concrete = None
                tid = thread(ev.tid)
                if tid is None:
                    tid = self._thread(ev.tid)
                cpu_ops.append(CpuOp(
                    name, ev.ts, ev.dur, tid, a.external_id, shapes, types, a.flops,
                    from_call_stack(a.call_stack) if a.call_stack else None, concrete))
            elif t is _PythonEvent:
                frame = library_frame(ev.name)  # the interned name, unless it is user code
                if frame is None:
                    frame = self._user_frame(ev)
                if keep_python:
                    tid = ev.tid  # an int64 column: no int object to share
                    py_start(ev.ts)
                    py_dur(ev.dur)
                    py_tid(tid if type(tid) is int else 0)
                    py_name(frame)
            elif t not in skipped:
                rest.append(ev)
                if t in respell:  # an old spelling of the two kinds above: in file order
                    self._add_plain(rest)
                    rest.clear()
        if rest:
            self._add_plain(rest)

    def _user_frame(self, ev: Any) -> str:
        """A python_function event whose name is new or user code: its interned name; a user
        frame is also kept for the stack sweep."""
        frame = self._python_frames.get(ev.name)
        if frame is None:
            frame = self._learn_python_frame(ev.name)
        if frame[1]:
            self.stacks.frames.setdefault(ev.tid, []).append((ev.ts, ev.ts + ev.dur, frame[0]))
        return frame[0]

    def _add_plain(self, events: list[Any]) -> None:  # _Event and the tagged structs
        """Every category, by ``ev.cat``: the plain path's loop (its reference)."""
        # The hot loop of the reader: locals for everything, one constructor call per object.
        p = self.profile
        cpu_ops, gpu, runtime, annotations = p.cpu_ops, p.gpu, p.runtime, p.annotations
        category = _CATEGORY.get
        intern = sys.intern
        cached = self._json_cache.get
        op_name = self._op_names.get
        decode_new = self._decode_new
        dims = self._dims
        stacks = self.stacks
        python_frame = self._python_frames.get
        frames = stacks.frames
        conv_ops = self._conv_ops
        thread = self._threads.get
        py = self.python.calls  # Python rows of the Timeline: every call, user code or not
        py_start, py_dur, py_tid, py_name = (py.start.append, py.dur.append, py.tid.append,
                                             py.name.append)
        for ev in events:
            kind = category(ev.cat)
            if kind == _CPU_OP:
                name = op_name(ev.name)
                if name is None:  # first sight of this name
                    name = self._learn_op_name(ev.name)
                if name is _STEP_MARKER:  # older torch: ProfilerStep#N as a cpu_op
                    kind_name, step = classify_annotation(ev.name)
                    annotations.append(Annotation(ev.name, ev.ts, ev.dur, kind_name, step=step))
                    continue
                a = ev.args
                if a.input_dims:
                    key = bytes(a.input_dims)
                    shapes = cached(key, _MISSING)
                    if shapes is _MISSING:
                        shapes = decode_new(key)
                    key = bytes(a.input_type)
                    types = cached(key, _MISSING)
                    if types is _MISSING:
                        types = decode_new(key)
                    # stride/padding/... and is_causal for FLOPs; only math ops need them
                    if a.concrete and name in conv_ops:
                        key = bytes(a.concrete)
                        concrete = cached(key, _MISSING)
                        if concrete is _MISSING:
                            concrete = decode_new(key)
                    else:
                        concrete = None
                else:
                    shapes = types = concrete = None
                tid = thread(ev.tid)
                if tid is None:
                    tid = self._thread(ev.tid)
                cpu_ops.append(CpuOp(
                    name, ev.ts, ev.dur, tid, a.external_id,
                    shapes, types, a.flops,
                    stacks.from_call_stack(a.call_stack) if a.call_stack else None,
                    concrete))
            elif kind == _PYTHON:
                frame = python_frame(ev.name)  # (interned name, is user code)
                if frame is None:
                    frame = self._learn_python_frame(ev.name)
                name = frame[0]
                if frame[1]:
                    frames.setdefault(ev.tid, []).append((ev.ts, ev.ts + ev.dur, name))
                if self.python_calls:
                    tid = thread(ev.tid)
                    py_start(ev.ts)
                    py_dur(ev.dur)
                    py_tid(self._thread(ev.tid) if tid is None else tid)
                    py_name(name)
            elif kind is None:
                if ev.name == "thread_name" and not ev.cat:  # a "ph": "M" metadata event
                    self._thread_names[f"{ev.pid}/{ev.tid}"] = str(ev.args.name)
                elif ev.cat == "Trace":
                    p.metadata["profiler_span_us"] = [ev.ts, ev.dur]
            elif kind == _RUNTIME:
                a = ev.args
                tid = thread(ev.tid)
                if tid is None:
                    tid = self._thread(ev.tid)
                runtime.append(RuntimeCall(intern(ev.name), ev.ts, ev.dur, tid,
                                           a.correlation, a.external_id))
            elif kind == _KERNEL:
                a = ev.args
                gpu.append(GpuActivity(
                    KERNEL, intern(ev.name), ev.ts, ev.dur, self._device(ev, a),
                    self._stream(ev, a), a.correlation, a.external_id, dims(a.grid),
                    dims(a.block), a.registers, a.shared_mem, a.blocks_per_sm, a.occupancy))
            elif kind == _MEMCPY or kind == _MEMSET:
                a = ev.args
                act = GpuActivity(MEMCPY if kind == _MEMCPY else MEMSET, intern(ev.name),
                                  ev.ts, ev.dur, self._device(ev, a), self._stream(ev, a),
                                  a.correlation, a.external_id)
                act.bytes = a.bytes
                gpu.append(act)
            elif kind == _INSTANT:
                if ev.name == "[memory]":
                    self.memory.add(ev)
            else:
                kind_name, step = classify_annotation(ev.name)
                annotations.append(Annotation(ev.name, ev.ts, ev.dur, kind_name,
                                              on_gpu=kind == _GPU_ANNOT, step=step))

    @staticmethod
    def _device(ev: _Event, a: _Args) -> int:
        if a.device is not None:
            return a.device
        return ev.pid if type(ev.pid) is int else 0

    @staticmethod
    def _stream(ev: _Event, a: _Args) -> int:
        if a.stream is not None:
            return a.stream
        return ev.tid if type(ev.tid) is int else 0

    # --- a trace read in two processes (_read_in_two) ---

    def export(self) -> Iterator[tuple[str, Any]]:
        """What this builder holds, as picklable frames for :meth:`merge` in another process:
        each model list as columns (a column pickles a repeated name or shape once), at most
        FRAME_ITEMS objects a frame, then everything else."""
        p = self.profile
        for kind, cls in _MODEL_LISTS.items():
            items = getattr(p, kind)
            for i in range(0, len(items), FRAME_ITEMS):
                chunk = items[i : i + FRAME_ITEMS]
                yield kind, [list(map(attrgetter(f), chunk)) for f in cls.__struct_fields__]
        m, py = self.memory.series, self.python.calls
        yield _REST, (p.metadata, p.devices, self._thread_names, self._events,
                      self.stacks.frames, [getattr(m, f) for f in MemoryEvents.__slots__],
                      (py.start, py.dur, py.tid, py.name))

    def merge(self, frames: Iterable[tuple[str, Any]]) -> None:
        """Go on as if this builder had read the events that gave ``frames`` (:meth:`export`)
        itself: after its own, in file order."""
        p = self.profile
        for kind, payload in frames:
            if kind == _REST:
                self._merge_rest(*payload)
            else:
                getattr(p, kind).extend(self._objects(_MODEL_LISTS[kind], payload))

    def _objects(self, cls: Any, columns: list[list[Any]]) -> list[Any]:
        # Names and kinds interned (the kinds are then model's constants again) and thread,
        # device and stream ids shared, as the read in one shares them: unpickled, a string
        # is a new object in each frame and an int one in each place
        shared = {v: v for v in self._threads.values()}
        for i, field in enumerate(cls.__struct_fields__):
            if field in ("name", "kind"):
                columns[i] = list(map(sys.intern, columns[i]))
            elif field in ("tid", "device", "stream"):
                columns[i] = list(map(shared.setdefault, columns[i], columns[i]))
        return list(map(cls, *columns))

    def _merge_rest(self, metadata: dict[str, Any], devices: list[DeviceInfo],
                    thread_names: dict[str, str], events: int,
                    frames: dict[Any, list[tuple[float, float, str]]],
                    memory: list[array], python: tuple[array, array, array, list[str]]) -> None:
        self.profile.metadata.update(metadata)  # later values win, as in file order
        self.profile.devices.extend(devices)
        self._thread_names.update(thread_names)
        self._events += events
        for tid, spans in frames.items():
            self.stacks.frames.setdefault(tid, []).extend(
                (start, end, sys.intern(name)) for start, end, name in spans)
        m = self.memory.series
        for field, column in zip(MemoryEvents.__slots__, memory, strict=True):
            getattr(m, field).extend(column)
        py = self.python.calls
        py.start.extend(python[0])
        py.dur.extend(python[1])
        py.tid.extend(python[2])
        py.name.extend(map(sys.intern, python[3]))

    def finish(self) -> Profile:
        p = self.profile
        p.memory = self.memory.finish()
        p.python = self.python.finish() if self.python_calls else None
        if not (p.gpu or p.cpu_ops or p.runtime or p.annotations):
            raise EmptyProfileError(
                p.source, "trace holds no kernels, CPU ops, runtime calls or annotations")
        by_start = attrgetter("start_us")
        for items in (p.gpu, p.cpu_ops, p.runtime, p.annotations):
            items.sort(key=by_start)
        self.stacks.attach(p.cpu_ops)
        p.metadata["events"] = self._events
        if self._thread_names:
            p.metadata["thread_names"] = self._thread_names
        return p
