"""The docs site builds without a warning, and works in a real browser opened on the built folder.

The build is the one `.ci/run` and docs/contributing.md give, ``sphinx-build -W --keep-going -b html
docs <folder>``: any warning fails it (a broken link, a reference to a page that is not there, an RST
error in a docstring, a public name missing from the API reference). The build runs once per module
and the browser test reads its output.

The browser is Debian's Chromium, driven through its chromedriver by selenium with both paths
given, so selenium-manager never looks for (or downloads) a driver; the test skips, saying why,
where either is missing. The pages are opened from disk (``file://``), the way the site is meant
to be used: a static folder anyone can open. Sphinx's search loads its index with a ``<script>``
tag, which works from disk too; the snippets under its results would not (a page fetched from disk
is refused), so conf.py turns them off (``html_show_search_summary``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from conftest import subprocess_env
from timescale import scaled

from .blocks import ROOT

pytestmark = pytest.mark.procs

DOCS = ROOT / "docs"
BUILD_S = 300  # the whole site took 17-58 s on a 2-core AMD EPYC shared with other work (2026-12-07)
BROWSER_S = 30  # one page load, one search, one wait
CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")
#: the sidebar links of the level pages (docs/guides/*/index.md)
LEVELS = ("Basic", "Intermediate", "Advanced", "Expert")
PUBLIC_NAME_WARNING = re.compile(r"public name (\S+) is missing from the API reference")


@dataclass
class Build:
    folder: Path
    returncode: int
    output: str


def sphinx_build(source: Path, folder: Path, builder: str = "html") -> Build:
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, str(source), str(folder)]
    try:
        done = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                              timeout=scaled(BUILD_S))
    except subprocess.TimeoutExpired as err:  # subprocess.run has killed and reaped it
        pytest.fail(f"sphinx-build still running after {err.timeout:.0f} s")
    return Build(folder, done.returncode, done.stdout + done.stderr)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Build:
    return sphinx_build(DOCS, tmp_path_factory.mktemp("site"))


@pytest.mark.timeout(BUILD_S)
def test_the_site_builds_without_a_warning(site: Build):
    assert site.returncode == 0, f"sphinx-build -W failed (exit {site.returncode}):\n{site.output[-6000:]}"
    assert (site.folder / "index.html").is_file()
    assert (site.folder / "searchindex.js").is_file()


@pytest.mark.timeout(BUILD_S)
def test_a_public_name_missing_from_the_api_reference_fails_the_build(tmp_path: Path):
    """The check of docs/_ext/public_names.py cannot pass silently: a copy of the API reference
    without its tuner page fails the build, naming exactly the names that page documents
    (``framework.tuner.LRFinder``; ``framework.tuner.Tuner`` is ``fw.Tuner``, on the framework page)."""
    source = tmp_path / "docs"
    shutil.copytree(DOCS / "api", source)  # api/index.md is the copy's start page
    (source / "tuner.md").unlink()
    documented = _documented_on(DOCS / "api" / "tuner.md")
    assert documented, "docs/api/tuner.md documents nothing"
    # the site's own configuration, run from its place (its paths are relative to docs/)
    (source / "conf.py").write_text(f"import runpy\nglobals().update(runpy.run_path({str(DOCS / 'conf.py')!r}))\n")
    built = sphinx_build(source, tmp_path / "out", builder="dummy")  # reads and checks all, writes nothing
    assert built.returncode != 0
    missing = set(PUBLIC_NAME_WARNING.findall(built.output))
    assert missing == documented, built.output[-6000:]


def _documented_on(page: Path) -> set[str]:
    return set(re.findall(r"^\.\. auto\w+:: (\S+)", page.read_text(), re.MULTILINE))


# --- the browser ----------------------------------------------------------------------------------


def _find(candidates: tuple[str, ...]) -> str | None:
    for name in candidates:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture
def browser(tmp_path: Path):
    """Headless Chromium through chromedriver, both from the system; quit (and so reaped) after the test."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    chromium, chromedriver = _find(CHROMIUM), _find(CHROMEDRIVER)
    if chromium is None or chromedriver is None:
        pytest.skip(f"needs Chromium and chromedriver (found: chromium={chromium}, chromedriver={chromedriver})")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=chromedriver, log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(options=options, service=service)  # stops chromedriver itself if this fails
    try:
        driver.set_page_load_timeout(scaled(BROWSER_S))
        driver.set_script_timeout(scaled(BROWSER_S))
        yield driver
    finally:
        driver.quit()  # closes Chromium, then stops and reaps chromedriver


def _console_errors(driver) -> list[str]:
    return [f"{entry.get('source', '')}: {entry['message']}" for entry in driver.get_log("browser")
            if entry["level"] == "SEVERE"]


def _no_console_errors(driver, where: str) -> None:
    errors = _console_errors(driver)  # read once: reading empties the browser's log
    assert not errors, f"{where}: the browser console logged errors: {errors}"


def _local_file(url: str) -> Path:
    """The file a ``file://`` link points at (without its query and fragment)."""
    parts = urlparse(url)
    assert parts.scheme == "file", f"a link out of the built folder: {url}"
    return Path(unquote(parts.path))


def _sidebar_links(driver) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    links = driver.find_elements(By.CSS_SELECTOR, ".sidebar-tree a.reference")
    return {link.get_attribute("textContent").strip(): link.get_attribute("href") for link in links}


def _shows_title_and_navigation(driver, page: Path) -> None:
    from selenium.webdriver.common.by import By

    heading = driver.find_element(By.CSS_SELECTOR, "article h1")
    title = heading.text.replace("#", "").replace("¶", "").strip()
    assert heading.is_displayed() and title, f"{page.name}: no visible title"
    assert title in driver.title, f"{page.name}: the window title {driver.title!r} does not name {title!r}"
    links = _sidebar_links(driver)
    missing = [level for level in LEVELS if level not in links]
    assert not missing, f"{page.name}: the sidebar lacks the levels {missing}; it has {sorted(links)}"
    for level in LEVELS:
        assert _local_file(links[level]).is_file(), f"{page.name}: the sidebar's {level} link leads nowhere ({links[level]})"


@pytest.mark.timeout(BUILD_S + 2 * BROWSER_S)
def test_pages_render_and_search_finds_fsdp_in_a_browser(site: Build, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    assert site.returncode == 0, "the site did not build (see the test above)"
    for page in (site.folder / "index.html", site.folder / "guides" / "advanced" / "fsdp.html"):
        browser.get(page.as_uri())
        _no_console_errors(browser, page.name)
        _shows_title_and_navigation(browser, page)

    # the search box of the sidebar, as a reader uses it: type, press Enter, read the results page
    box = browser.find_element(By.CSS_SELECTOR, "form[role=search] input[name=q]")
    box.send_keys("FSDP", Keys.ENTER)
    wait = WebDriverWait(browser, scaled(BROWSER_S))
    wait.until(lambda d: d.current_url.split("?")[0].endswith("/search.html"))
    # searchtools.js says "Search finished, found N page(s) ..." once the index has been read
    wait.until(lambda d: "Search finished" in d.find_element(By.CSS_SELECTOR, "#search-results").text)
    results = browser.find_elements(By.CSS_SELECTOR, "#search-results ul.search li a")
    assert results, f"searching FSDP found no page: {browser.find_element(By.CSS_SELECTOR, '#search-results').text!r}"
    for link in results:
        assert _local_file(link.get_attribute("href")).is_file(), f"a result leads nowhere: {link.get_attribute('href')}"
    _no_console_errors(browser, "search.html")
