"""Static guards on the dashboard sources (no browser needed): the DOM is built from text only,
and every ECharts instance goes through the one wrapper that forces non-HTML tooltips."""

from __future__ import annotations

import re

from tests.conftest import REPO

SRC = REPO / "frontend" / "src"
HTML_SINKS = re.compile(r"innerHTML|outerHTML|dangerouslySetInnerHTML|insertAdjacentHTML|"
                        r"document\.write|createContextualFragment|DOMParser")


def _sources() -> dict[str, str]:
    files = {p.relative_to(SRC).as_posix(): p.read_text() for p in SRC.rglob("*.ts*")}
    assert "main.tsx" in files and "charts.tsx" in files
    return files


def test_no_html_string_sinks_in_the_dashboard_sources() -> None:
    hits = [f"{name}: {m.group(0)}" for name, text in _sources().items()
            for m in HTML_SINKS.finditer(text)]
    assert not hits, f"build the DOM from text, not HTML strings: {hits}"


def test_echarts_only_through_the_safe_wrapper() -> None:
    sources = _sources()
    users = sorted(n for n, t in sources.items() if "echarts.init(" in t)
    assert users == ["charts.tsx"]
    assert 'renderMode: "richText"' in sources["charts.tsx"]
    # views import the Chart component, never echarts itself
    direct = sorted(n for n, t in sources.items()
                    if re.search(r'from "echarts', t) and n != "charts.tsx")
    assert not direct, f"import Chart from charts.tsx instead: {direct}"
