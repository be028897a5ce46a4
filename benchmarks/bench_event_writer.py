"""What one always-on scalar event costs the hooks' flush thread: our record framing
(store/records.py, google-crc32c) against TensorBoard's pure-Python ``RecordWriter``, side by
side in one process (interleaved rounds; CPU time of this thread, which holds the GIL).

Each event is the one the torch hook writes per iteration after a window: iteration time,
host step time, GPU step time, GPU time, data wait, two memory peaks, model TFLOP/s, MFU.

    python3 benchmarks/bench_event_writer.py             # any machine (no GPU needed)
    python3 benchmarks/bench_event_writer.py --events 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from tb_gpuprof.store import layout, records

VALUES = {layout.ITERATION_TIME_TAG: 41.2, layout.HOST_STEP_TIME_TAG: 41.0,
          layout.GPU_STEP_TIME_TAG: 40.7, layout.GPU_TIME_TAG: 30.3, layout.DATA_WAIT_TAG: 0.1,
          layout.MEMORY_ALLOCATED_PEAK_TAG: 5120.0, layout.MEMORY_RESERVED_PEAK_TAG: 6144.0,
          layout.MODEL_TFLOPS_TAG: 36.4, layout.MFU_TAG: 3.7}


def event_bytes(step: int) -> bytes:
    """One scalar event as EventWriter.add_scalars builds it."""
    summary = summary_pb2.Summary()
    for tag, value in VALUES.items():
        summary.value.add(tag=tag, simple_value=value)
    return event_pb2.Event(wall_time=time.time(), step=step, summary=summary).SerializeToString()


def us_per_event(frame: object, n: int) -> float:
    """Thread CPU µs per event: build it and frame it into a buffer."""
    buf = io.BytesIO()
    write = RecordWriter(buf).write if frame == "tensorboard" else (
        lambda data: buf.write(records.frame(data)))
    t0 = time.thread_time_ns()
    for i in range(n):
        write(event_bytes(i))
    return (time.thread_time_ns() - t0) / n / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=5000, help="events per round and arm")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ours, theirs = [], []
    for _ in range(args.rounds):  # interleaved: the machine's drift weighs on both arms
        theirs.append(us_per_event("tensorboard", args.events))
        ours.append(us_per_event("records", args.events))
    a, b = statistics.median(theirs), statistics.median(ours)
    print(f"TensorBoard RecordWriter: {a:.1f} us/event; store.records: {b:.1f} us/event; "
          f"ratio {b / a:.3f} (median of {args.rounds} interleaved rounds of {args.events})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
