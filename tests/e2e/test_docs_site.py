"""The docs site works offline and from disk (issue #50, item 9): built with
mkdocs into a scratch folder and opened as file:// pages in Debian's chromium
(Playwright): every Mermaid diagram is drawn (a diagram that does not parse
stays a <pre> block), nothing is fetched from the network (no CDN, no web
fonts), and the home page links to pages, not to folders (which a browser
shows from disk as directory listings). The Python reference names App.handler,
SyncClient.publish_workflow and Job's fields."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_the_site_reads_offline_from_disk_with_its_diagrams_drawn(tmp_path: Path) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip("no chromium: install Debian's chromium package (.ci/run does)")
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "-d", str(site)], cwd=ROOT, capture_output=True, text=True,
                           timeout=180)
    assert built.returncode == 0, built.stderr[-2000:]
    pages = {p: len(re.findall(r"^```mermaid$", p.read_text(), re.M))
             for p in (ROOT / "docs").rglob("*.md")}
    pages = {p: n for p, n in pages.items() if n}
    assert pages, "no page has a diagram"
    reference = (site / "reference" / "python.html").read_text()
    for name in ("jobq.App.handler", "jobq.SyncClient.publish_workflow", "jobq.Job.payload",
                 "jobq.Job.attempt"):
        assert f'id="{name}"' in reference, name
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        remote: list[str] = []
        page.on("request", lambda r: remote.append(r.url)
                if not r.url.startswith(("file:", "data:", "blob:")) else None)
        for md, n in sorted(pages.items()):
            html = site / md.relative_to(ROOT / "docs").with_suffix(".html")
            page.goto(html.as_uri())
            # Material draws each diagram into a div.mermaid; one that does not
            # parse stays a pre.mermaid.
            page.wait_for_function(f"document.querySelectorAll('div.mermaid').length == {n}"
                                   " || document.querySelectorAll('pre.mermaid').length > 0 "
                                   "&& performance.now() > 8000", timeout=20000)
            assert page.locator("pre.mermaid").count() == 0, f"{md.name}: a diagram failed"
            heights = page.locator("div.mermaid").evaluate_all(
                "els => els.map(e => e.getBoundingClientRect().height)")
            assert len(heights) == n and min(heights) > 40, (md.name, heights)
        page.goto((site / "index.html").as_uri())
        hrefs = page.locator("nav a[href]").evaluate_all("as => as.map(a => a.href)")
        local = [h for h in hrefs if h.startswith("file:")]
        assert local and all(h.split("#")[0].endswith(".html") for h in local), local[:10]
        browser.close()
    assert remote == [], f"fetched from the network: {remote[:5]}"
