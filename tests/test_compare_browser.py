"""compare.html in real headless Chromium: the verdict matrix on the first screen, the figure rendered, no network
request. Needs ``pip install playwright`` and Debian's ``chromium`` package (as tests/test_report_browser.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_compare import LARGE, SMALL, _masking_changes_nothing, _study
from test_report_browser import ARGS, CHROMIUM, VIEWPORT

from dynheads.report import write_compare

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs: pip install playwright")
if not shutil.which(CHROMIUM):
    pytest.skip(f"the browser test needs Chromium at {CHROMIUM}: apt-get install -y chromium", allow_module_level=True)


@pytest.fixture(scope="module")
def compare_html(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("compare-browser")
    small = _study(base / "small", SMALL, 135_000_000)
    large = _study(base / "large", LARGE, 1_500_000_000, like=small)
    _masking_changes_nothing(large)
    return write_compare([small, large], base / "out")[1]


def test_the_matrix_is_on_the_first_screen_and_the_figure_renders(compare_html):
    blocked: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)

            def route(request_route):
                url = request_route.request.url
                if url.startswith(("file://", "data:")):
                    request_route.continue_()
                else:
                    blocked.append(url)
                    request_route.abort()

            page.route("**/*", route)
            page.goto(compare_html.as_uri())
            matrix = page.locator("table.matrix").bounding_box()
            cells = page.locator("table.matrix td.supported, table.matrix td.not-supported").count()
            figure_width = page.locator("#by-size img").evaluate("image => image.naturalWidth")
        finally:
            browser.close()
    assert blocked == []
    assert matrix is not None and matrix["y"] + matrix["height"] <= VIEWPORT["height"], matrix  # all of it
    assert cells >= 8  # both models' decided verdicts, coloured
    assert figure_width > 0
