"""`nmt serve`'s web page in a real browser: a headless Chromium (the system's, driven by Selenium) loads the page
from a real server, types a sentence as a person would, and reads the translation that offline `nmt translate`
gives. Skipped, with the reason, where no Chromium and chromedriver are installed (`.ci/run` installs Debian's).

NMT_SERVE_SCREENSHOT=FILE saves a screenshot of the page after the translation (docs/serve-page.png is made so,
with NMT_SERVE_PAGE_MODEL naming the model to show instead of the tests' toy one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nmt-cli[serve]')")
pytest.importorskip("selenium", reason="the test-serve extra is not installed (selenium)")
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    pytest.skip("no Chromium and chromedriver on this machine (Debian: apt-get install chromium chromium-driver)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service as ChromeService  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from conftest import toy_pairs  # noqa: E402
from helpers_serve import Server  # noqa: E402
from helpers_translate import make_checkpoint  # noqa: E402

WAIT = 90  # seconds: only ends a hang (the page translates within a second or two)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, toy_tokenizer_bytes):
    shown = os.environ.get("NMT_SERVE_PAGE_MODEL")
    if shown:
        return shown
    return str(make_checkpoint(tmp_path_factory.mktemp("serve-page") / "tiny.pt", toy_tokenizer_bytes, seed=3,
                               max_positions=128))


@pytest.fixture(scope="module")
def browser():
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,860", "--lang=en-US"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


def offline(ckpt: str, text: str) -> str:
    """What `nmt translate` prints for `text`."""
    out = subprocess.run([sys.executable, "-c", "import sys; from nmt_cli.cli import main; main(sys.argv[1:])",
                          "translate", "-m", ckpt, "--threads", "1"], input=text + "\n", capture_output=True,
                         text=True, timeout=300, check=True)
    return out.stdout.rstrip("\n")


def value(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).get_property("value")


def test_the_page_translates_as_one_types(browser, ckpt, tmp_path):
    sentence = os.environ.get("NMT_SERVE_PAGE_TEXT") or toy_pairs(3, seed=7)[0][0]
    expected = offline(ckpt, sentence)
    s = Server("-m", ckpt, "--no-engine-process", "--suggestions", str(tmp_path / "corrections.jsonl"))
    try:
        start = time.monotonic()
        browser.get(s.url + "/")
        WebDriverWait(browser, WAIT).until(lambda d: "ready" in d.find_element(By.TAG_NAME, "body").get_attribute(
            "class"))
        assert Select(browser.find_element(By.ID, "source")).first_selected_option.get_attribute("value") == "en"
        assert Select(browser.find_element(By.ID, "target")).first_selected_option.get_attribute("value") == "de"
        # the text box has the focus on load: type into it as a person does, key by key
        active = browser.switch_to.active_element
        assert active.get_attribute("id") == "input"
        active.send_keys(sentence)
        WebDriverWait(browser, WAIT).until(lambda d: value(d, "output") == expected)
        seconds = time.monotonic() - start
        assert browser.find_element(By.ID, "count").text == f"{len(sentence)} / 10000"
        assert not browser.find_element(By.ID, "error").is_displayed()
        assert "10000 characters" in browser.find_element(By.ID, "limits").text
        assert not browser.find_element(By.ID, "key-row").is_displayed()  # no key needed here
        if os.environ.get("NMT_SERVE_SCREENSHOT"):
            browser.save_screenshot(os.environ["NMT_SERVE_SCREENSHOT"])
        # the other controls are reachable by keyboard: Tab from the text box reaches Clear
        active.send_keys(Keys.TAB)
        assert browser.switch_to.active_element.get_attribute("id") == "clear"
        # a correction: edit the translation and send it; the server keeps it as a JSON line
        browser.find_element(By.ID, "edit").click()
        out = browser.find_element(By.ID, "output")
        out.send_keys(" !")
        browser.find_element(By.ID, "send").click()
        WebDriverWait(browser, WAIT).until(lambda d: "kept" in d.find_element(By.ID, "status").text)
        kept = (tmp_path / "corrections.jsonl").read_text(encoding="utf-8")
        assert f'"s": "{expected} !"' in kept and f'"translation": "{expected}"' in kept
        print(f"\nthe page: loaded, typed and translated in {seconds:.1f} s")
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_the_page_asks_for_an_api_key_when_the_server_requires_one(browser, ckpt, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("secret-1\n")
    sentence = toy_pairs(3, seed=8)[1][0]
    expected = offline(ckpt, sentence)
    s = Server("-m", ckpt, "--no-engine-process", "--api-keys", str(keys))
    try:
        browser.get(s.url + "/")
        WebDriverWait(browser, WAIT).until(lambda d: "ready" in d.find_element(By.TAG_NAME, "body").get_attribute(
            "class"))
        key = browser.find_element(By.ID, "api-key")
        assert key.is_displayed()
        browser.find_element(By.ID, "input").send_keys(sentence)
        WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.ID, "error").is_displayed())
        assert "API key" in browser.find_element(By.ID, "error").text
        key.send_keys("secret-1")  # typing the key translates again
        WebDriverWait(browser, WAIT).until(lambda d: value(d, "output") == expected)
        assert not browser.find_element(By.ID, "error").is_displayed()
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_the_page_with_a_language_as_its_own_target(browser, ckpt):
    """/languages lists each language as its own target (as LibreTranslate's): the page offers every language as a
    source, and German into German gives the text back as typed; English into German still translates."""
    sentence = toy_pairs(3, seed=9)[2][0]
    expected = offline(ckpt, sentence)
    s = Server("-m", ckpt, "--no-engine-process")
    try:
        browser.get(s.url + "/")
        WebDriverWait(browser, WAIT).until(lambda d: "ready" in d.find_element(By.TAG_NAME, "body").get_attribute(
            "class"))
        source, target = Select(browser.find_element(By.ID, "source")), Select(browser.find_element(By.ID, "target"))
        assert [o.get_attribute("value") for o in source.options] == ["en", "de"]
        assert [o.get_attribute("value") for o in target.options] == ["de", "en"]
        source.select_by_value("de")
        assert [o.get_attribute("value") for o in target.options] == ["de"]
        browser.find_element(By.ID, "input").send_keys(sentence)
        WebDriverWait(browser, WAIT).until(lambda d: value(d, "output") == sentence)
        assert not browser.find_element(By.ID, "error").is_displayed()
        source.select_by_value("en")
        target.select_by_value("de")
        WebDriverWait(browser, WAIT).until(lambda d: value(d, "output") == expected)
        assert not browser.find_element(By.ID, "error").is_displayed()
    finally:
        assert s.stop() == 0, "".join(s.log)
