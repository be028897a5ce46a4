"""The Timeline view in real Chromium over a real TensorBoard: rows from /timeline, zoom and pan
change the range asked of the server, a click details the event (op, shapes) as text, and a
hostile kernel name stays text."""

from __future__ import annotations

from .conftest import RUN_HOSTILE, RUN_LOOP, screenshot
from .dom import eventually, open_tab, select_run
from .kineto_synth import HOSTILE_KERNEL

LANE_H = {"cpu": 14, "gpu": 20}


def _open(page, run: str) -> None:
    select_run(page, run)
    page.wait_for_selector("[data-testid=view-dashboard]")
    open_tab(page, "timeline")
    eventually(lambda: int(page.locator("[data-testid=timeline-canvas]").get_attribute(
        "data-bars") or 0) > 0, True, what="bars drawn")


def _range(page) -> tuple[float, float]:
    el = page.locator("[data-testid=tl-range]")
    return float(el.get_attribute("data-lo")), float(el.get_attribute("data-hi"))


def _click_bar(page, server, run: str, pick) -> dict:
    """Click the widest single-event bar ``pick(name, category)`` accepts; returns the bar."""
    lo, hi = _range(page)
    box = page.locator("[data-testid=timeline-canvas]").bounding_box()
    answer = server.route("timeline", run=run, start_us=lo, end_us=hi, width=round(box["width"]))
    b = answer["bars"]
    k = box["width"] / (hi - lo)
    best = None
    for i in range(len(b["id"])):
        s, e = max(b["start"][i], lo), min(b["end"][i], hi)
        name, cat = answer["names"][b["name"][i]], answer["categories"][b["cat"][i]]
        if b["id"][i] >= 0 and e > s and pick(name, cat) and (best is None or e - s > best[0]):
            best = (e - s, i, s, e, name)
    assert best is not None, "no bar to click"
    _, i, s, e, name = best
    row = answer["rows"][b["row"][i]]
    label = page.locator("[data-testid=timeline-rows] .tl-label").nth(row["id"] + 1)
    y = label.bounding_box()["y"] + b["lane"][i] * LANE_H[row["kind"]] + LANE_H[row["kind"]] / 2
    page.mouse.click(box["x"] + ((s + e) / 2 - lo) * k, y)
    return {"id": b["id"][i], "name": name}


def test_timeline_rows_zoom_pan_and_click(page, server) -> None:
    whole = server.route("timeline", run=RUN_LOOP, width=1000)
    _open(page, RUN_LOOP)
    labels = page.locator("[data-testid=timeline-rows] .tl-label").all_text_contents()
    assert labels == ["iterations"] + [r["label"] for r in whole["rows"]]
    assert {r["kind"] for r in whole["rows"]} == {"cpu", "gpu"}
    lo, hi = _range(page)
    assert (lo, hi) == (whole["start_us"], whole["end_us"])

    canvas = page.locator("[data-testid=timeline-canvas]")
    box = canvas.bounding_box()
    with page.expect_request(lambda r: "timeline?" in r.url and "start_us" in r.url):
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 40)
        for _ in range(5):
            page.mouse.wheel(0, -300)
    zlo, zhi = eventually(lambda: _range(page), check=lambda r: r[1] - r[0] < (hi - lo) / 4,
                          what="zoomed range")
    # drag right: the view moves back in time by the dragged share of the range
    page.mouse.move(box["x"] + 400, box["y"] + 40)
    page.mouse.down()
    page.mouse.move(box["x"] + 600, box["y"] + 40, steps=5)
    page.mouse.up()
    plo, phi = _range(page)
    assert abs((zlo - plo) - (zhi - zlo) * 200 / box["width"]) < (zhi - zlo) * 0.02
    assert abs((phi - plo) - (zhi - zlo)) < 1e-6 * (zhi - zlo) + 1e-6

    for _ in range(6):  # down to a few kernels per screen
        page.click("[data-testid=tl-zoom-in]")
    page.wait_for_timeout(400)  # the bars of the new range arrive
    bar = _click_bar(page, server, RUN_LOOP, lambda name, cat: cat == "kernel")
    details = page.locator("[data-testid=timeline-details]")
    details.wait_for()
    assert details.get_attribute("data-event") == str(bar["id"])
    assert page.locator("[data-testid=timeline-event-name]").text_content() == bar["name"]
    ev = server.route("timeline", run=RUN_LOOP, event=bar["id"])["event"]
    if ev.get("op"):
        assert ev["op"] in details.text_content()
    if ev.get("input_shapes"):
        assert page.locator("[data-testid=timeline-shapes] tbody tr").count() == \
            len(ev["input_shapes"])
    assert page.locator("[data-testid=tl-download]").get_attribute("href").startswith("trace")
    screenshot(page, "timeline")


def test_timeline_shows_a_hostile_kernel_name_as_text(page, server) -> None:
    fine = server.route("timeline", run=RUN_HOSTILE, width=8192)  # every kernel its own bar
    b = fine["bars"]
    i = next(i for i in range(len(b["id"]))
             if fine["names"][b["name"][i]] == HOSTILE_KERNEL and b["id"][i] >= 0)
    mid = (b["start"][i] + b["end"][i]) / 2
    row = fine["rows"][b["row"][i]]
    _open(page, RUN_HOSTILE)
    lo, hi = _range(page)
    box = page.locator("[data-testid=timeline-canvas]").bounding_box()
    label = page.locator("[data-testid=timeline-rows] .tl-label").nth(row["id"] + 1)
    x = box["x"] + (mid - lo) / (hi - lo) * box["width"]
    y = label.bounding_box()["y"] + LANE_H[row["kind"]] / 2
    page.mouse.move(x, y)
    for _ in range(6):  # zoom in under the cursor until the kernel is alone
        page.mouse.wheel(0, -300)
    page.wait_for_timeout(400)
    page.mouse.click(x, y)
    name = page.locator("[data-testid=timeline-event-name]")
    eventually(lambda: name.text_content() if name.count() else "", HOSTILE_KERNEL,
               what="hostile name in the details")
    assert page.evaluate("window.__xss") is None
    assert page.locator("img").count() == 0
    screenshot(page, "timeline-hostile")
