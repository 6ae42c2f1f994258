"""``dcost serve`` in a real browser: the page loads, a slider moves, the numbers follow the API.

Starts ``dcost serve --port 0`` in a subprocess (``tests/serve_process.py``), drives Debian's
headless Chromium (``/usr/bin/chromium``, installed by ``make browser``; Playwright's own browser
download is never used) with Playwright, and checks the page's numbers against dcost's API called
here. Saves the page as ``docs/figures/explorer.png`` for the docs. Every wait is bounded; the
server and the browser are always stopped. Skipped only when Chromium is absent.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import urllib.parse
import urllib.request

import pytest
import serve_process

import dcost

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FIRST_S = 400.0  # for the first answers (compiling the programs, cold, on 2 busy cores)
LATER_S = 60.0  # for an update after the first
SCREENSHOT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "figures" / "explorer.png"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"{CHROMIUM} is absent: `make browser` installs Debian's chromium package",
    ),
]


# installed by the dev extra (make test): absent only outside it, e.g. in `make floors`
pytest.importorskip("uvicorn", reason="the serve extra (pip install 'dcost[serve]')")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright (the dev extra)")


@pytest.fixture(scope="module")
def server():
    with serve_process.running() as address:
        yield address


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=60_000)
        try:
            pg = browser.new_page(viewport={"width": 1500, "height": 820})
            pg.set_default_timeout(LATER_S * 1000)
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            pg.goto(server + "/", timeout=60_000)
            _settled(pg, FIRST_S)
            pg.errors = errors  # type: ignore[attr-defined]
            yield pg
        finally:
            browser.close()


def _settled(pg, seconds: float) -> None:
    """Wait until no request is in flight and every answer has been drawn."""
    pg.wait_for_function(
        """() => document.body.dataset.pending === '0'
               && document.getElementById('point-cost').textContent !== '–'
               && document.getElementById('opt-batch').textContent !== '–'
               && document.querySelector('#fleet tbody').children.length > 0
               && document.getElementById('bars').children.length > 0""",
        timeout=seconds * 1000,
    )


def _pixels(png: bytes):
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(png), format="png")


def _save_screenshot(png: bytes) -> None:
    """Write the page's picture for the docs, unless the one there shows the same page: a
    rerun redraws a dozen pixels by 1/255 (text antialiasing), which is no reason to change a
    committed file."""
    if SCREENSHOT.exists():
        old, new = _pixels(SCREENSHOT.read_bytes()), _pixels(png)
        if old.shape == new.shape and (abs(old - new) > 2 / 255).mean() < 1e-4:
            return
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.write_bytes(png)


def _number(pg, selector: str) -> float:
    return float(pg.inner_text(selector).replace(",", ""))


def _api_report(batch: float):
    """The API's own answer (a ``dcost.Report``) for the page's default question at ``batch``."""
    from dcost.web.queries import DEFAULTS as d

    return dcost.decode(
        dcost.Design(batch=batch, chips=d["chips"]),
        dcost.hardware(d["hardware"]),
        dcost.model(d["model"]),
        dcost.Workload(d["context"] + d["output"] / 2, prompt=d["context"], output=d["output"]),
    )


def _api_cost_per_million(batch: float) -> float:
    return float(_api_report(batch).cost_per_token) * 1e6


def test_page_shows_the_api_numbers_and_follows_a_slider(page, server):
    from dcost.web.queries import DEFAULTS

    assert page.errors == []
    b0 = DEFAULTS["batch"]
    assert _number(page, "#point-batch") == b0
    # shown with 4 significant digits
    assert _number(page, "#point-cost") == pytest.approx(_api_cost_per_million(b0), rel=1e-3)

    # one step of the batch slider is 1/8 of an octave: eight steps right double the batch
    slider = page.locator("#batch")
    slider.focus()
    for _ in range(8):
        slider.press("ArrowRight")
    assert page.inner_text("#batch-value") == f"{int(2 * b0)} sequences"
    page.wait_for_function(
        f"() => document.getElementById('point-batch').textContent === '{int(2 * b0)}'"
    )
    _settled(page, LATER_S)
    cost = _number(page, "#point-cost")
    assert cost == pytest.approx(_api_cost_per_million(2 * b0), rel=1e-3)
    assert cost < _api_cost_per_million(b0)  # a larger batch shares the weight reads
    r = _api_report(2 * b0)
    hbm = float(dcost.hardware(DEFAULTS["hardware"]).hbm_capacity)
    fits = float(r.memory_per_chip) <= 0.9 * hbm
    meets = float(r.tpot) <= DEFAULTS["tpot_slo"]
    assert fits and meets  # the default question's design is a valid one, and the page says so
    assert page.inner_text("#point-check") == "fits HBM and meets the TPOT target"

    # the optimum and the fleet shown are the server's JSON answers for the same controls
    params = {**DEFAULTS, "batch": 2 * b0}
    url = f"{server}/api/optimum?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=LATER_S) as r:
        opt = json.load(r)
    assert opt["feasible"]
    assert _number(page, "#opt-batch") == opt["batch"]
    assert page.inner_text("#opt-binding") == ", ".join(opt["binding"])
    assert page.errors == []

    shot = page.screenshot(full_page=True)
    assert len(shot) > 10_000
    _save_screenshot(shot)
