"""report.html in real headless Chromium: no network request, no console error, every figure rendered, the first
screen shows every verdict with its figure, and the per-step view answers a click on a token.
Needs ``pip install playwright`` and Debian's ``chromium`` package."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dynheads.report import write_report

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

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs: pip install playwright")
if not shutil.which(CHROMIUM):
    pytest.skip(f"the browser test needs Chromium at {CHROMIUM}: apt-get install -y chromium", allow_module_level=True)


VIEWPORT = {"width": 1280, "height": 800}  # a laptop screen


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    from test_report import make_reproduce_dir

    root = make_reproduce_dir(tmp_path_factory.mktemp("reproduce-browser"))
    return write_report(root)[1]


def test_report_opens_offline_and_the_step_view_responds(report_html, tmp_path):
    blocked, errors = [], []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})

            def route(request_route):
                url = request_route.request.url
                if url.startswith(("file://", "data:")):
                    request_route.continue_()
                else:
                    blocked.append(url)
                    request_route.abort()

            page.route("**/*", route)
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(report_html.as_uri(), wait_until="load")
            shots = Path(os.environ.get("DYNHEADS_SCREENSHOT_DIR") or tmp_path)
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "report-top.png"))

            images = page.eval_on_selector_all(
                "img",
                """images => images.map(image => {
                const box = image.getBoundingClientRect();
                return {ok: image.complete && image.naturalWidth > 0 && box.width > 0 && box.height > 0,
                        alt: image.alt};
            })""",
            )
            assert len(images) == 6 + 4  # the figures make_reproduce_dir writes, and the cards' (3 NIAH claims, RAG)
            assert [image["alt"] for image in images if not image["ok"]] == []

            assert page.locator("#sv-sample option").count() == 6 + 3  # NIAH and HotpotQA samples
            chips = page.locator("#sv-tokens .chip")
            assert chips.count() == 12
            chips.nth(4).click()
            heading = page.locator("#sv-panel h3").inner_text()
            assert heading.startswith("Step 4:") and "retrieved" in heading
            assert page.locator("#sv-tokens .chip.sel").inner_text() == chips.nth(4).inner_text()
            assert page.locator("#sv-panel td").first.inner_text().startswith("L")
            assert "needle, token" in page.locator("#sv-panel td.where").first.inner_text()
            assert page.locator("#sv-panel .strip .tick").count() > 0
            page.locator("#per-step-view").screenshot(path=str(shots / "report-step-view.png"))

            page.select_option("#sv-sample", index=7)  # a HotpotQA sample
            chips.nth(2).click()
            assert page.locator("#sv-panel h3").inner_text().startswith("Step 2:")

        finally:
            browser.close()
    assert blocked == []
    assert errors == []


def test_the_first_screen_shows_every_verdict_with_its_figure(report_html, tmp_path):
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(report_html.as_uri(), wait_until="load")
            shots = Path(os.environ.get("DYNHEADS_SCREENSHOT_DIR") or tmp_path)
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "report-first-screen.png"))  # the viewport only: the first screen
            cards = page.eval_on_selector_all(
                ".card",
                """cards => cards.map(card => {
                const inView = element => { const box = element.getBoundingClientRect();
                    return box.width > 0 && box.height > 0 && box.top >= 0 && box.left >= 0
                           && box.bottom <= window.innerHeight && box.right <= window.innerWidth; };
                const image = card.querySelector("img");
                return {visible: inView(card), title: card.querySelector(".card-head a").innerText,
                        status: card.querySelector(".badge").innerText,
                        rows: card.querySelectorAll("td").length,
                        image: image && image.complete && image.naturalWidth > 0 && inView(image)};
            })""",
            )
            sections = page.locator("section p.verdict").all_inner_texts()
        finally:
            browser.close()
    assert len(sections) == 7 and len(cards) == 7  # 3 claims x (NIAH, HotpotQA) + RAG, each once on the first screen
    for card, sentence in zip(cards, sections, strict=True):
        assert card["visible"] and sentence.startswith(f"Verdict: {card['title']}: {card['status']}"), card
        assert card["rows"] >= 2 * 3  # at least two numbers, each beside the paper's
    # make_reproduce_dir runs every NIAH stage and RAG, not the HotpotQA analyses: those cards say "stage not run"
    assert [card["image"] for card in cards] == [True, True, True, None, None, None, True]
