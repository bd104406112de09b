"""report.html in real headless Chromium: no network request, no console error, every figure rendered, and the
per-step view answers a click on a token. Needs ``pip install playwright`` and Debian's ``chromium`` package."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dynheads.report import write_report

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs: pip install playwright")
if not shutil.which(CHROMIUM):
    pytest.skip(f"the browser test needs Chromium at {CHROMIUM}: apt-get install -y chromium", allow_module_level=True)


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

            images = page.eval_on_selector_all("img", """images => images.map(image => {
                const box = image.getBoundingClientRect();
                return {ok: image.complete && image.naturalWidth > 0 && box.width > 0 && box.height > 0,
                        alt: image.alt};
            })""")
            assert len(images) == 6  # the figures make_reproduce_dir writes
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
