"""Debian's headless Chromium driven by selenium, for the report.html tests (installed by .ci/run)."""
from __future__ import annotations

import os
import shutil

import pytest


def chrome():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (binary and driver):
        if os.environ.get("CANN_EXPORT_NO_BROWSER") == "1":
            pytest.skip("CANN_EXPORT_NO_BROWSER=1: no headless browser on this machine")
        pytest.fail("the report test needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver; .ci/run installs them); set CANN_EXPORT_NO_BROWSER=1 to skip it")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1200,1400"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)
