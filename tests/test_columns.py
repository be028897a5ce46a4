"""analysis/columns.py: columns read once inside a scope, afresh outside, never stale."""

from __future__ import annotations

import pytest

from tb_gpuprof.analysis import columns
from tb_gpuprof.model import CpuOp


def _ops(n: int) -> list[CpuOp]:
    return [CpuOp(f"aten::op{i % 3}", float(i), 0.5 * i, tid=i % 2) for i in range(n)]


def test_inside_a_scope_a_column_is_read_once_and_shared():
    ops = _ops(10)
    with columns.column_scope():
        first = columns.floats(ops, "start_us")
        assert columns.floats(ops, "start_us") is first
        assert columns.ends(ops).tolist() == [o.start_us + o.dur_us for o in ops]
        assert columns.values(ops, "name") == tuple(o.name for o in ops)
        ops[3].external_id, ops[7].external_id = 0, 12  # 0 is present, None is not
        assert columns.present(ops, "external_id").tolist() == [
            o.external_id is not None for o in ops]
        assert columns.present(ops, "external_id").sum() == 2
        with pytest.raises(ValueError):  # shared, so nobody may write into it
            first[0] = 1.0
        ops.append(CpuOp("aten::late", 99.0, 1.0))  # the list changed: read again
        assert columns.floats(ops, "start_us").tolist()[-1] == 99.0
        other = _ops(10)  # an equal list is another list
        assert columns.floats(other, "start_us") is not columns.floats(ops, "start_us")
    # outside the scope nothing is kept
    assert columns.floats(ops, "start_us") is not columns.floats(ops, "start_us")


def test_forget_drops_only_that_lists_columns():
    ops, other = _ops(4), _ops(4)
    with columns.column_scope():
        kept = columns.floats(other, "start_us")
        first = columns.floats(ops, "start_us")
        columns.forget(ops)
        assert columns.floats(ops, "start_us") is not first
        assert columns.floats(other, "start_us") is kept
