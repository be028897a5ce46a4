"""flops.SHAPE_COUNTED_OPS (linking skips op_flops for other names) against op_flops itself on
every op of the real traces in tests/data: an op of another name has FLOPs only as recorded."""

from __future__ import annotations

import glob
import os

import msgspec
import pytest

from tb_gpuprof.analysis.flops import SHAPE_COUNTED_OPS, op_flops
from tb_gpuprof.readers import load_profile

DATA = os.path.join(os.path.dirname(__file__), "data")
TRACES = sorted(glob.glob(os.path.join(DATA, "**", "*.json.gz"), recursive=True))


@pytest.mark.parametrize("path", TRACES, ids=[os.path.relpath(p, DATA) for p in TRACES])
def test_only_the_listed_names_get_flops_from_shapes(path):
    counted = 0
    for op in load_profile(path).cpu_ops:
        if op.name not in SHAPE_COUNTED_OPS:
            assert op_flops(op) == (op.flops or None)
        # with its recorded FLOPs taken away, a listed op is counted from its shapes
        elif op.input_shapes and op_flops(msgspec.structs.replace(op, flops=None)):
            counted += 1
    assert counted or "xplane" in path or not any(
        op.name in SHAPE_COUNTED_OPS and op.input_shapes for op in load_profile(path).cpu_ops)
