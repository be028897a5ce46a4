"""Helpers shared by the browser tests: the dashboard's number formats (re-stated here so the
tests check what a user reads against the route JSON) and DOM polling."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

DASH = "\u2014"


def fmt_num(v: float | None, digits: int = 0) -> str:
    return DASH if v is None else f"{v:,.{digits}f}"


def fmt_ms(v: float | None) -> str:
    if v is None:
        return DASH
    if v == 0:
        return "0 ms"
    if abs(v) >= 1000:
        return f"{fmt_num(v / 1000, 2)} s"
    if abs(v) >= 100:
        return f"{fmt_num(v, 0)} ms"
    if abs(v) >= 1:
        return f"{fmt_num(v, 1)} ms"
    return f"{fmt_num(v * 1000, 1)} µs"


def fmt_us(v: float | None) -> str:
    return DASH if v is None else fmt_ms(v / 1000)


def fmt_pct(v: float | None, digits: int = 1) -> str:
    return DASH if v is None else f"{fmt_num(v, digits)}%"


def eventually(read: Callable[[], Any], expected: Any = None, *,
               check: Callable[[Any], bool] | None = None, timeout: float = 15.0,
               what: str = "the page") -> Any:
    """Poll ``read()`` until it equals ``expected`` (or ``check`` accepts it); assert at the end."""
    deadline = time.monotonic() + timeout
    ok = check or (lambda v: v == expected)
    while True:
        value = read()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            if check is None:
                assert value == expected, f"{what}: {value!r} != {expected!r}"
            raise AssertionError(f"{what}: unexpected {value!r}")
        time.sleep(0.1)


def column(scope: Any, table_testid: str, col: str) -> list[str]:
    """Text of one column (td[data-col]) of a table, all rows."""
    cells = scope.locator(f"[data-testid={table_testid}] tbody td[data-col={col}]")
    return cells.all_text_contents()


def select_run(scope: Any, run: str) -> None:
    scope.select_option("[data-testid=run-select]", run)


def open_tab(scope: Any, tab: str) -> None:
    scope.click(f"nav.tabs button[data-tab={tab}]")
