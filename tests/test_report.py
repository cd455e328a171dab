"""`simctl report`: one self-contained HTML page and Markdown per study, opened in a real browser
(Debian's headless chromium via Playwright, or Selenium with chromedriver; skipped with the
reason where neither can be had)."""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from moesim.sim.cli.main import main
from tests.util import ROOT

QUICKSTART = ROOT / "scenarios" / "flame-lru.yaml"
TRACE = ROOT / "traces" / "samples" / "flame-moe-290m.parquet"
CHROMIUM = "/usr/bin/chromium"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished comparison: two lossless policies, a lossy one, a bound and an n/a one, at two
    cache rates, with its report written."""
    out = tmp_path_factory.mktemp("report") / "cmp"
    assert main(["compare", str(QUICKSTART), "--policies", "lru,no-cache,random-substitute,belady,moepic",
                 "--rates", "0.25,0.5", "--set", "workload.requests=1", "--out", str(out), "-j", "1",
                 "--no-progress"]) == 0
    assert main(["report", str(out)]) == 0
    return out


def _rows(md: str, heading: str) -> list[list[str]]:
    """The body rows of the Markdown table under the heading that starts with ``heading``."""
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"### {heading}"))
    body = []
    for ln in lines[start + 4:]:
        if not ln.startswith("|"):
            break
        body.append([c.strip() for c in ln.strip("|").split("|")])
    return body


def test_report_has_provenance_command_figures_and_ranked_tables(study: Path) -> None:
    md = (study / "report.md").read_text()
    html = (study / "report.html").read_text()
    digest = hashlib.sha256(TRACE.read_bytes()).hexdigest()
    for text in (md, html):
        assert "flame-moe-290m on rtx-4090, trace flame-moe-290m.parquet" in text
        assert digest in text
        assert "no overhead (idealised runtime)" in text   # where the runtime's numbers come from
        assert "simctl compare" in text and "--policies lru,no-cache,random-substitute,belady,moepic" in text
        assert "10: 8 ok, 0 failed, 2 n/a" in text
        # the workload, the seed and the source revision (issue 35)
        assert "batch 1, phases decode, requests the first 1 (1 replayed)" in text
        cells = re.sub(r"</?t[hd]>|\|", " ", text)
        assert re.search(r"\bseed\s+0\s", cells)
        assert re.search(r"source revision\s+(git [0-9a-g.-]+|moesim )", cells)
    assert [r[2] for r in _rows(md, "Lossless")] == ["lru", "no-cache", "lru", "no-cache"]
    assert [r[2] for r in _rows(md, "Lossy")] == ["random-substitute"] * 2
    assert [r[2] for r in _rows(md, "Bounds")] == ["belady (bound)"] * 2
    # the n/a points, with the reason: one row for the policy and reason, listing the cache rates
    na = _rows(md, "Not run")
    assert [r[:2] for r in na] == [["0.25, 0.5", "moepic"]] and "lookahead_logits" in na[0][3]
    figures = re.findall(r"!\[[^]]*\]\(([^)]+)\)", md)
    assert figures == ["report-figures/tpot.png", "report-figures/hit_rate.png", "report-figures/speedup.png"]
    for f in figures:
        assert (study / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # self-contained: every image inline, nothing fetched from elsewhere
    assert html.count('src="data:image/png;base64,') == 3
    assert not re.search(r'(src|href)="(?!data:)', html)


def test_report_says_when_the_command_was_not_recorded(study: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old"
    shutil.copytree(study, old)
    (old / "study.json").unlink()
    assert main(["report", str(old), "--metric", "hit-rate"]) == 0
    md = (old / "report.md").read_text()
    assert "Not recorded: the folder was made before moesim recorded its commands" in md
    assert "ranked by hit rate" in md
    capsys.readouterr()
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nowhere" in err and "no such folder" in err


OVERFLOW_JS = """(() => {
  const out = [];
  if (document.documentElement.scrollWidth > window.innerWidth) out.push('page ' + document.documentElement.scrollWidth);
  for (const d of document.querySelectorAll('.scroll')) if (d.scrollWidth > d.clientWidth + 1) out.push('table ' + d.scrollWidth);
  for (const e of document.querySelectorAll('.badge, th, td, img'))
    if (e.getBoundingClientRect().right > window.innerWidth) out.push(e.tagName + ' ' + e.textContent.slice(0, 30));
  return out;
})()"""
"""What lies beyond the 1,280 px window: the page, a table wider than its box (scrolled), or a
badge, cell or figure whose right edge is off screen (empty when everything fits)."""


def _chromium_missing() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"no browser: {CHROMIUM} is missing (apt-get install chromium chromium-driver)"
    return None


def _open_with_playwright(page_url: str, shot: Path) -> tuple[list[int], list[int]]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=CHROME_ARGS,
                                                    headless=True, viewport={"width": 1280, "height": 900})
        try:
            page = ctx.new_page()
            page.goto(page_url)
            page.wait_for_load_state("load")
            widths = page.evaluate("Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)")
            rows = page.evaluate("Array.from(document.querySelectorAll('table.ranking')).map(t => t.tBodies[0].rows.length)")
            page.screenshot(path=str(shot), full_page=True)
            overflow = page.evaluate(OVERFLOW_JS)
        finally:
            ctx.close()
    assert overflow == [], overflow
    return widths, rows


def _open_with_selenium(page_url: str, shot: Path) -> tuple[list[int], list[int]]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    with tempfile.TemporaryDirectory() as profile:
        for a in [*CHROME_ARGS, f"--user-data-dir={profile}", "--window-size=1280,900"]:
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        try:
            driver.get(page_url)
            widths = driver.execute_script("return Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)")
            rows = driver.execute_script(
                "return Array.from(document.querySelectorAll('table.ranking')).map(t => t.tBodies[0].rows.length)")
            driver.save_screenshot(str(shot))
            overflow = driver.execute_script("return " + OVERFLOW_JS)
        finally:
            driver.quit()
    assert overflow == [], overflow
    return widths, rows


def test_report_renders_in_a_real_browser(study: Path, tmp_path: Path) -> None:
    missing = _chromium_missing()
    if missing:
        pytest.skip(missing)
    try:
        import playwright.sync_api  # noqa: F401

        opener = _open_with_playwright
    except ImportError:
        try:
            import selenium  # noqa: F401
        except ImportError:
            pytest.skip("no browser driver: pip install playwright (or selenium); the dev extra has it")
        if not Path("/usr/bin/chromedriver").is_file():
            pytest.skip("selenium without /usr/bin/chromedriver (apt-get install chromium-driver)")
        opener = _open_with_selenium
    shot = tmp_path / "report.png"
    widths, rows = opener((study / "report.html").resolve().as_uri(), shot)
    assert len(widths) == 3 and all(w > 0 for w in widths)     # every figure decoded
    assert rows == [4, 2, 2, 1]     # lossless, lossy, bounds: one row per point; n/a: one per policy and reason
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_a_sweep_over_hardware_names_gets_ranked_bars_per_value(tmp_path: Path) -> None:
    """Nothing numeric swept: one ranked-bar chart per hardware, ranked within each hardware."""
    import yaml

    spec = {"name": "hw", "base": str(QUICKSTART), "set": {"workload.requests": 1},
            "grid": {"policy": ["lru", "no-cache"], "hardware": ["rtx-4090", "a100-sxm-80gb"]}}
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["sweep", str(tmp_path / "hw.yaml"), "--out", str(tmp_path / "o"), "-j", "1", "--no-progress"]) == 0
    assert main(["report", str(tmp_path / "o"), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert re.findall(r"!\[[^]]*\]\(([^)]+)\)", md) == ["report-figures/ranked_1.png", "report-figures/ranked_2.png"]
    assert "hardware = rtx-4090" in md and "hardware = a100-sxm-80gb" in md
    rows = _rows(md, "Lossless")
    assert [(r[0], r[1], r[2]) for r in rows] == [("a100-sxm-80gb", "1", "lru"), ("a100-sxm-80gb", "2", "no-cache"),
                                                 ("rtx-4090", "1", "lru"), ("rtx-4090", "2", "no-cache")]
    assert "Ranked by TPOT (mean) within each hardware" in md
    assert not (tmp_path / "o" / "report.html").exists()     # --out: the study's folder is left as it was
