"""A real headless browser for the live page: Debian's Chromium through its chromedriver; nothing is downloaded."""

import contextlib
import os
from pathlib import Path
from typing import NoReturn

import pytest

from helpers.app import app_env

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def no_browser(why: str) -> NoReturn:
    """Skip, saying why; fail where MMT_REQUIRE_BROWSER=1: CI installs the browser, driver and selenium."""
    if os.environ.get("MMT_REQUIRE_BROWSER") == "1":
        pytest.fail(why)
    pytest.skip(why)


@contextlib.contextmanager
def chromium(tmp_path, tag):
    """Debian's headless Chromium via its chromedriver; nothing is downloaded."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        no_browser(
            f"no browser to drive: {', '.join(missing)} not installed (apt-get install chromium chromium-driver)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        no_browser(f"no selenium to drive the browser ({exc}): pip install selenium")

    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.binary_location = str(CHROMIUM)
    # the driver and the browser carry the test's tag: the tag fixture sees any of them left running
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER), env=app_env(tag)))
    try:
        yield driver
    finally:
        driver.quit()
