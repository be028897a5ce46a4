"""Make a large XPlane by repeating a real one's timeline: the benchmark input for XPlane readers.

Every line of every plane gets ``copies`` copies of its events, copy k shifted by k x the
profile's span, so the result is one long, well-formed profile of the same program (same
metadata tables, same kernels, more iterations). Written with the project's own XSpace schema
(tb_gpuprof/readers/xplane_schema.py); fields that schema does not declare are kept as they
were (protobuf keeps unknown fields on re-serialization).

    python benchmarks/scale_xplane.py tests/data/jax_conv_h200.xplane.pb /tmp/big.xplane.pb \
        --size-mb 25
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from tb_gpuprof.readers.xplane_schema import XLine, XPlane, XSpace


def _span_ps(plane_msgs: list) -> int:
    end = 0
    for p in plane_msgs:
        for raw in p.lines:
            line = XLine.FromString(raw)
            for ev in line.events:
                end = max(end, line.timestamp_ns * 1000 + ev.offset_ps + ev.duration_ps)
    return end


def scale(data: bytes, copies: int) -> bytes:
    space = XSpace.FromString(data)
    planes = [XPlane.FromString(raw) for raw in space.planes]
    stride = _span_ps(planes) + 1_000_000  # copies follow each other with 1 us between
    for p in planes:
        scaled = []
        for raw in p.lines:
            line = XLine.FromString(raw)
            template = list(line.events)
            for k in range(1, copies):
                for ev in template:
                    new = line.events.add()
                    new.CopyFrom(ev)
                    if ev.HasField("offset_ps"):
                        new.offset_ps = ev.offset_ps + k * stride
            scaled.append(line.SerializeToString())
        del p.lines[:]
        p.lines.extend(scaled)
    del space.planes[:]
    space.planes.extend(p.SerializeToString() for p in planes)
    return space.SerializeToString()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--size-mb", type=float, default=25.0)
    args = ap.parse_args()
    data = open(args.source, "rb").read()
    one, two = len(scale(data, 1)), len(scale(data, 2))  # metadata once, events per copy
    copies = max(1, round((args.size_mb * 1e6 - one) / max(two - one, 1)) + 1)
    out = scale(data, copies)
    with open(args.out, "wb") as f:
        f.write(out)
    print(f"{args.out}: {len(out) / 1e6:.1f} MB, {copies} copies of {args.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
