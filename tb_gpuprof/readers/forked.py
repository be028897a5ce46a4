"""One generator run in a forked child process while the caller goes on with its own work.

The Kineto reader decodes a big trace in two byte ranges at once: the child the second, the
caller the first (a decode holds the GIL, so threads would take turns). The child's items
come back pickled through a pipe. Any failure of the child (it raised, was killed, sent less
than it should) is one :class:`ChildFailed` in the caller, which then does the work itself:
the child's error, if the input causes it, comes again, from the caller's own code.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

_DONE = "tb_gpuprof.forked: done"  # the child's last item: the stream is complete


class ChildFailed(Exception):
    """The child raised, died, or its results are incomplete."""


def can_fork() -> bool:
    """Whether a forked helper is safe here and has an idle core of its own to run on.

    Not with other Python threads: a lock one of them holds stays locked in the child. Not
    in a multiprocessing worker: its pool sizes itself by the worker's own memory and cores.
    """
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform
        cores = os.cpu_count() or 1
    return cores >= 2 and _running_elsewhere() <= cores - 2


def _running_elsewhere() -> int:
    """Tasks other than this one that are running or ready to run, now (Linux; 0 elsewhere).

    The child only pays off on a core nobody else wants: with every core busy it takes
    turns with this process, and the work it adds (shipping its part back) is pure loss.
    """
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])  # "0.52 0.40 0.31 2/345 6789"
    except (OSError, ValueError, IndexError):
        return 0
    return max(running - 1, 0)


class ForkedJob:
    """``job(*args)`` running in a forked child; :meth:`results` yields what it yielded.

    Raises ChildFailed where no child can be started. Use as a context manager: leaving it
    kills a child that is still running and reaps it.
    """

    def __init__(self, job: Callable[..., Iterator[Any]], *args: Any) -> None:
        read_end, write_end = os.pipe()
        try:
            pid = _fork()
        except OSError as e:  # out of processes or memory: the caller does the work
            os.close(read_end)
            os.close(write_end)
            raise ChildFailed(f"cannot fork: {e}") from None
        if pid == 0:
            os.close(read_end)
            _run_child(job, args, write_end)
        os.close(write_end)
        self._pid: int | None = pid
        self._pipe = open(read_end, "rb")  # closed by close()

    def results(self) -> Iterator[Any]:
        """The child's items in order; ChildFailed once it is clear that some are missing."""
        while True:
            try:
                item = pickle.load(self._pipe)
            except (EOFError, pickle.UnpicklingError, OSError) as e:
                raise ChildFailed(f"child's results end early: {e!r}") from None
            if isinstance(item, str) and item == _DONE:
                break
            yield item
        if self._reap() != 0:
            raise ChildFailed("child exited with an error")

    def _reap(self) -> int:
        pid, self._pid = self._pid, None
        if pid is None:
            return 0
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def close(self) -> None:
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap()
        self._pipe.close()

    def __enter__(self) -> ForkedJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fork() -> int:
    # Objects that exist now are moved out of the collector's reach for the fork: a full
    # collection in the child would write to each one's header and so copy every page of
    # the caller's heap. Only where the process froze nothing itself (we unfreeze it all).
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    pid = -1
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns of fork with other OS threads: BLAS's idle workers, which
            # the child never calls (no other Python thread runs: can_fork)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    finally:
        if freeze and pid != 0:  # the child keeps them frozen
            gc.unfreeze()
    return pid


def _run_child(job: Callable[..., Iterator[Any]], args: tuple[Any, ...], fd: int) -> NoReturn:
    """Runs the job, then writes its pickled items; never returns into the caller's code."""
    status = 1
    try:
        # all items first: the caller reads only once its own part is done, and the child's
        # pickling then overlaps the caller's work instead of following it
        frames = [pickle.dumps(item, pickle.HIGHEST_PROTOCOL) for item in job(*args)]
        frames.append(pickle.dumps(_DONE, pickle.HIGHEST_PROTOCOL))
        with open(fd, "wb") as out:
            for frame in frames:
                out.write(frame)
        status = 0
    except BaseException:
        pass  # the caller redoes the work, and meets the error there if the input causes it
    finally:
        os._exit(status)
