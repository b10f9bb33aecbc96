"""Headless Chromium driven by Selenium, for the management web UI tests.

Debian's `chromium` and `chromium-driver` (scripts/install-test-system-packages installs
them); nothing is downloaded at run time. `Ui` wraps the few gestures the tests make: open a
page of the UI, log in, fill a form, press a button, confirm a dialog, wait for text, and take
a screenshot of the whole page.

Screenshots go to a temporary folder; with AMQP_SERVER_UPDATE_SCREENSHOTS=1 they go to
docs/management-ui/, which is how the pictures in docs/management-ui.md are made.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

DOCS_SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "management-ui"
WINDOW = (1400, 900)
WAIT_S = 15.0


def chromium_paths() -> tuple[str, str]:
    """The browser and its driver; a clear failure (never a skip) when they are missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert browser and driver, ("the management UI tests need Debian's chromium and chromium-driver: "
                                "run scripts/install-test-system-packages")
    return browser, driver


def start_chromium(download_dir: Path) -> webdriver.Chrome:
    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}", "--lang=en-US", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update"):
        options.add_argument(argument)
    chrome = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    chrome.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(download_dir)})
    return chrome


class Ui:
    def __init__(self, driver: webdriver.Chrome, base_url: str, screenshot_dir: Path) -> None:
        self.driver = driver
        self.base_url = base_url
        self.screenshot_dir = screenshot_dir

    # ---- navigation and waiting -----------------------------------------------------------

    def open(self, hash_path: str = "/", reload: bool = False) -> None:
        """Show a page of the UI ("#/queues"); `reload` loads the whole document again."""
        url = f"{self.base_url}/#{hash_path}"
        if reload or not self.driver.current_url.startswith(self.base_url):
            # A URL that differs only in its fragment would not load the document again.
            self.driver.get("about:blank")
            self.driver.get(url)
        else:
            self.driver.execute_script("window.location.hash = arguments[0]", hash_path)

    def wait(self, condition: Callable[[webdriver.Chrome], Any], timeout: float = WAIT_S, what: str = "") -> Any:
        def check(driver: webdriver.Chrome) -> Any:
            try:
                return condition(driver)
            except (StaleElementReferenceException, WebDriverException):
                return None
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(check)
        except Exception as error:
            raise AssertionError(f"timed out waiting for {what or condition}; page says:\n{self.page_text()}") from error

    def find(self, css: str, within: WebElement | None = None) -> WebElement:
        return self.wait(lambda d: (within or d).find_element(By.CSS_SELECTOR, css), what=css)

    def page_text(self) -> str:
        try:
            return self.driver.find_element(By.TAG_NAME, "body").text
        except WebDriverException:
            return "<no page>"

    def wait_for_text(self, text: str, css: str = "body", timeout: float = WAIT_S) -> WebElement:
        def shown(driver: webdriver.Chrome) -> WebElement | None:
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                if text in element.text:
                    return element
            return None
        return self.wait(shown, timeout, what=f"{text!r} in {css}")

    def errors(self) -> list[str]:
        return [element.text for element in self.driver.find_elements(By.CSS_SELECTOR, ".notice.error")]

    # ---- gestures -------------------------------------------------------------------------

    def log_in(self, user: str, password: str) -> None:
        """Submit the login form (logging out first if the page opens logged in)."""
        self.open("/", reload=True)
        shown = self.wait(lambda d: d.find_elements(By.CSS_SELECTOR, "input[name=username], button[name=logout]"),
                          what="the login form or the logged-in header")
        if shown[0].get_attribute("name") == "logout":
            self.log_out()
        self.type(self.find("input[name=username]"), user)
        self.type(self.find("input[name=password]"), password)
        self.find(".login button[type=submit]").click()

    def log_out(self) -> None:
        self.find("button[name=logout]").click()
        self.find("input[name=username]")

    def click(self, by: str, locator: str) -> None:
        """Click what `locator` finds, trying again while the page redraws it (a refresh replaces
        list rows, which leaves an element found a moment before stale)."""
        def clicked(driver: webdriver.Chrome) -> bool:
            driver.find_element(by, locator).click()
            return True
        self.wait(clicked, what=f"{locator} to click")

    def type(self, element: WebElement, text: str) -> None:
        element.clear()
        element.send_keys(text)

    def fill(self, name: str, text: str, within: WebElement | None = None) -> WebElement:
        element = self.find(f"[name='{name}']", within)
        if element.tag_name == "select":
            Select(element).select_by_value(text)
        else:
            self.type(element, text)
        return element

    def button(self, label: str, within: WebElement | None = None) -> WebElement:
        xpath = f".//button[normalize-space()='{label}']"
        return self.wait(lambda d: next((b for b in (within or d).find_elements(By.XPATH, xpath) if b.is_displayed()), None),
                         what=f"button {label!r}")

    def press(self, label: str, within: WebElement | None = None) -> None:
        self.button(label, within).click()

    def section(self, title: str) -> WebElement:
        """An expandable section of a page (<details>), opened."""
        summary = self.wait(lambda d: next((s for s in d.find_elements(By.CSS_SELECTOR, "details.section > summary")
                                            if s.text.strip() == title), None), what=f"section {title!r}")
        details = summary.find_element(By.XPATH, "..")
        if details.get_attribute("open") is None:
            summary.click()
        return details

    def confirm(self, typed: str | None = None) -> str:
        """Accept the open confirmation dialog (typing `typed` into its field); its question."""
        dialog = self.find("dialog[open]")
        question = dialog.find_element(By.TAG_NAME, "p").text
        if typed is not None:
            self.type(dialog.find_element(By.CSS_SELECTOR, "input[name=confirm-input]"), typed)
        dialog.find_element(By.CSS_SELECTOR, "button[value=confirm]").click()
        self.wait(lambda d: not d.find_elements(By.CSS_SELECTOR, "dialog[open]"), what="the dialog to close")
        return question

    def script(self, code: str, *args: Any) -> Any:
        return self.driver.execute_script(code, *args)

    # ---- pictures -------------------------------------------------------------------------

    def screenshot(self, name: str) -> Path:
        """The whole page (the window grows to the page's height for the picture)."""
        height = min(self.script("window.scrollTo(0, 0); return Math.ceil(document.documentElement.scrollHeight)"), 6000)
        self.driver.set_window_size(WINDOW[0], max(WINDOW[1], height))
        # The window's size includes what is not page: grow it by the difference once.
        shortfall = height - self.script("return window.innerHeight")
        if shortfall > 0:
            self.driver.set_window_size(WINDOW[0], max(WINDOW[1], height) + shortfall)
        # Two animation frames: the charts' resize observers have redrawn them at the new size.
        self.driver.execute_async_script(
            "const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(done));")
        path = self.screenshot_dir / f"{name}.png"
        self.driver.save_screenshot(str(path))
        self.driver.set_window_size(*WINDOW)
        return path


def screenshot_dir(tmp: Path) -> Path:
    if os.environ.get("AMQP_SERVER_UPDATE_SCREENSHOTS") == "1":
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return DOCS_SCREENSHOTS
    return tmp
