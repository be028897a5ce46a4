"""The host work of a timed block: what the training thread did and what the process's
other threads did beside it, apart from how fast the machine let them run (issue 13).

On the H200's KVM guest a launch-bound loop's speed drifts by tens of percent per minute
(docs/performance.md), so a wall-clock ratio of blocks minutes apart cannot resolve 1 %.
What a hook could add to such a loop is work on the training thread (CUPTI callbacks on
every launch, a collection, our own calls) or work beside it that takes the GIL or a CPU
(the hook's scalar writer and NVML sampler threads). Per block this records:

- user-mode instructions and cycles retired by the training thread (``perf_event_open``, the
  thread only), where the kernel offers hardware counters: the instruction count does not
  depend on the host's speed. A guest without a virtual PMU (the H200 guest: no ``cpu``
  under /sys/bus/event_source/devices) and most containers offer none; then -1.
- the CPU time of the training thread and of every other Python thread of the process
  (``pthread_getcpuclockid``): the hooks' threads. Their share of the block's wall time
  bounds what they can take from a GIL-bound loop (their Python work holds the GIL).
- the training thread's voluntary and involuntary context switches and minor page faults
  (``getrusage(RUSAGE_THREAD)``): waits (the GIL, I/O), preemption, and memory the allocator
  had given back and must map again (after a window's results are freed, say).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import platform
import resource
import struct
import threading
import time
from typing import NamedTuple

_SYSCALL = {"x86_64": 298, "aarch64": 241}
_HARDWARE, _INSTRUCTIONS, _CYCLES = 0, 1, 0
_ENABLE = 0x2400  # PERF_EVENT_IOC_ENABLE
_TIMES = 1 | 2  # read_format: time enabled, time running (a multiplexed counter is scaled)
# flags: disabled (bit 0), exclude_kernel (5), exclude_hv (6): user mode only, which an
# unprivileged process may count on its own threads at perf_event_paranoid 2
_USER_ONLY = (1 << 0) | (1 << 5) | (1 << 6)


class _Attr(ctypes.Structure):  # struct perf_event_attr, PERF_ATTR_SIZE_VER5 (112 bytes)
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("sample_period", ctypes.c_uint64),
                ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64),
                ("config2", ctypes.c_uint64), ("branch_sample_type", ctypes.c_uint64),
                ("sample_regs_user", ctypes.c_uint64), ("sample_stack_user", ctypes.c_uint32),
                ("clockid", ctypes.c_int32), ("sample_regs_intr", ctypes.c_uint64),
                ("aux_watermark", ctypes.c_uint32), ("sample_max_stack", ctypes.c_uint16),
                ("reserved", ctypes.c_uint16)]


class Work(NamedTuple):
    """Cumulative counts, read at a block's two ends (the difference is the block's)."""

    instructions: int  # user mode, the training thread; -1: no hardware counter
    cycles: int
    thread_cpu_ns: int  # the training thread
    others_cpu_ns: int  # the process's other Python threads, while they were seen alive
    voluntary_switches: int
    involuntary_switches: int
    minor_faults: int  # the training thread's: memory it touched that had to be mapped again


def _open(config: int) -> int:
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        return -1
    attr = _Attr(type=_HARDWARE, size=ctypes.sizeof(_Attr), config=config, flags=_USER_ONLY,
                 read_format=_TIMES)
    libc = ctypes.CDLL(None, use_errno=True)
    # pid 0, cpu -1: the calling thread, on whichever CPU it runs; no group, no flags
    fd = int(libc.syscall(nr, ctypes.byref(attr), 0, -1, -1, 0))
    if fd >= 0:
        fcntl.ioctl(fd, _ENABLE, 0)
    return fd


class WorkCounter:
    """Counters of the thread that opened it; ``read()`` there, at a block's ends."""

    def __init__(self, fds: tuple[int, int] | None) -> None:
        self.fds = fds
        self._others_seen: dict[int, int] = {}  # thread ident -> its CPU ns at the last read
        self._others_total = 0

    @classmethod
    def open(cls) -> WorkCounter:
        """Counters on the calling thread; hardware counts only where the kernel has them."""
        fds = None
        try:
            ins = _open(_INSTRUCTIONS)
            if ins >= 0:
                cyc = _open(_CYCLES)
                if cyc >= 0:
                    fds = (ins, cyc)
                else:
                    os.close(ins)
        except OSError:
            pass
        return cls(fds)

    @property
    def hardware(self) -> bool:
        return self.fds is not None

    def read(self) -> Work:
        ins, cyc = (self._value(fd) for fd in self.fds) if self.fds else (-1, -1)
        ru = resource.getrusage(resource.RUSAGE_THREAD)
        return Work(ins, cyc, time.thread_time_ns(), self._others_cpu_ns(),
                    ru.ru_nvcsw, ru.ru_nivcsw, ru.ru_minflt)

    def _others_cpu_ns(self) -> int:
        """The other threads' CPU time since each was first seen, summed: a thread first seen
        at this read counts from here; one that ended keeps what was counted up to its last
        read (a thread born and gone within one block is not seen)."""
        me = threading.get_ident()
        seen: dict[int, int] = {}
        for t in threading.enumerate():
            if t.ident is None or t.ident == me:
                continue
            try:
                now = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
            except (OSError, ProcessLookupError):
                continue  # ended between enumerate() and here
            self._others_total += max(0, now - self._others_seen.get(t.ident, now))
            seen[t.ident] = now
        self._others_seen = seen
        return self._others_total

    @staticmethod
    def _value(fd: int) -> int:
        value, enabled, running = struct.unpack("QQQ", os.read(fd, 24))
        return value if running >= enabled or running == 0 else value * enabled // running

    def close(self) -> None:
        for fd in self.fds or ():
            os.close(fd)
