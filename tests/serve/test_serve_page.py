"""The web page of `multibranch serve` in a real headless Chromium: a real server (the one the
command builds, run by uvicorn on a free loopback port in a thread) with a tiny random model; type,
translate, see the n-best lists (equal to our Translator's), open the attention view and find a
target x source heat map whose header tokens are the SentencePiece pieces of the source and of the
translation and whose rows sum to 1; an over-long text gives the server's 413 message on the page.
With a classifier the page labels texts: every label with its probability, equal to the model's.

Needs Debian's `chromium` and `chromium-driver` and the selenium package; skipped with the reason
when one is missing, unless MULTIBRANCH_REQUIRE_BROWSER=1 (CI), which makes absence a failure.
Nothing is downloaded: the driver path is given to Selenium (so Selenium Manager never runs) and
SE_OFFLINE is set.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.helpers.translation import (
    corpus_lines,  # noqa: E402
    translator_of,
)

MAX_CHARS = 120
LINES = [line for line in corpus_lines(40, seed=41) if len(line) < 40][:2]


def _need_browser() -> tuple[str, str]:
    """(chromium, chromedriver) paths, or skip (fail when MULTIBRANCH_REQUIRE_BROWSER=1)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if missing:
        reason = (f"the headless-browser test needs {', '.join(missing)} "
                  "(apt-get install chromium chromium-driver; pip install selenium)")
        if os.environ.get("MULTIBRANCH_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason}, and MULTIBRANCH_REQUIRE_BROWSER=1")
        pytest.skip(reason)
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-extensions", "--no-first-run", "--window-size=1100,1000"):
        options.add_argument(argument)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")  # belt and braces: Selenium Manager must never download
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
        driver.set_page_load_timeout(30)
        try:
            yield driver
        finally:
            driver.quit()


@pytest.fixture(scope="module")
def server(checkpoint) -> Iterator[str]:
    yield from _serve(checkpoint)


def _serve(ckpt: Any) -> Iterator[str]:
    """The server `multibranch serve --ckpt CKPT --port 0 --max-chars N` builds (arguments parsed by
    the CLI, the engine loaded, the page mounted), run on a free loopback port in a thread; its URL.
    At the end it is stopped as on SIGTERM (should_exit) and must finish."""
    from multibranch.cli import build_parser
    from multibranch.commands.serve import build_server

    args = build_parser().parse_args(["serve", "--ckpt", str(ckpt), "--port", "0", "--device", "cpu",
                                      "--max-chars", str(MAX_CHARS)])
    uvicorn_server = build_server(args)
    thread = threading.Thread(target=uvicorn_server.run, daemon=True)
    thread.start()
    try:
        for _ in range(3000):
            if uvicorn_server.started or not thread.is_alive():
                break
            thread.join(0.01)
        assert uvicorn_server.started, "the server did not start"
        host, port = uvicorn_server.servers[0].sockets[0].getsockname()[:2]
        assert host == "127.0.0.1"
        yield f"http://127.0.0.1:{port}"
    finally:
        uvicorn_server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()


def _wait(driver: Any, condition: Any) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 20, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException])
    return wait.until(condition)


def _texts(elements: list[Any]) -> list[str]:
    return [element.get_attribute("textContent") for element in elements]


def test_translate_see_nbest_and_attention_heat_map(browser, server, checkpoint, tokenizer):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(server + "/")
    _wait(browser, lambda d: "engine" in d.find_element(By.ID, "model-info").text)
    browser.find_element(By.ID, "source").send_keys("\n".join(LINES))
    browser.find_element(By.ID, "translate").click()
    sentences = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#sentences .sentence"))
    assert len(sentences) == len(LINES)

    reference = translator_of(str(checkpoint))
    nbest = min(3, reference.cfg.beam)
    expected = reference.translate_nbest(LINES, nbest)
    shown = [_texts(s.find_elements(By.CSS_SELECTOR, ".hyp .text")) for s in sentences]
    assert shown == [[text for text, _ in entries] for entries in expected]
    assert len(shown[0]) == nbest > 1
    assert not browser.find_element(By.ID, "error").is_displayed()

    # the attention of the best translation of the first sentence: target x source
    best = expected[0][0][0]
    [src] = tokenizer.encode_src([LINES[0]])
    [tgt] = tokenizer.encode_tgt([best])
    source = [*(tokenizer.src.id_to_piece(i) for i in src), "</s>"]
    target = ["<s>", *(tokenizer.tgt.id_to_piece(i) for i in tgt)]
    sentences[0].find_element(By.CSS_SELECTOR, ".hyp").click()
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#heatmap td.cell"))
    assert Select(browser.find_element(By.ID, "kind")).first_selected_option.get_attribute("value") == "cross"
    assert _texts(browser.find_elements(By.CSS_SELECTOR, "#heatmap th.col")) == source
    assert _texts(browser.find_elements(By.CSS_SELECTOR, "#heatmap th.row")) == target
    weights = browser.execute_script(  # the cells' weights, row by row
        "return [...document.querySelectorAll('#heatmap tbody tr')]"
        ".map((row) => [...row.querySelectorAll('td.cell')].map((cell) => Number(cell.dataset.weight)));")
    assert [len(row) for row in weights] == [len(source)] * len(target)
    assert all(abs(sum(row) - 1) < 1e-4 for row in weights)

    # another attention type redraws the map: decoder self-attention is target x target
    Select(browser.find_element(By.ID, "kind")).select_by_value("decoder_self")
    _wait(browser, lambda d: _texts(d.find_elements(By.CSS_SELECTOR, "#heatmap th.col")) == target)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#heatmap td.cell")) == len(target) ** 2


def test_an_over_long_text_shows_the_server_message(browser, server):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    _wait(browser, lambda d: "engine" in d.find_element(By.ID, "model-info").text)
    browser.find_element(By.ID, "source").send_keys("ka" * MAX_CHARS)
    browser.find_element(By.ID, "translate").click()
    error = _wait(browser, lambda d: d.find_element(By.ID, "error") if d.find_element(By.ID, "error").is_displayed()
                  else None)
    assert error.text == f"Error 413: texts[0] has {2 * MAX_CHARS} characters: at most {MAX_CHARS} per text"
    assert not browser.find_element(By.ID, "results").is_displayed()


def test_classifier_page_shows_labels_with_probabilities(browser, tmp_path_factory):
    from selenium.webdriver.common.by import By

    from multibranch.loading.checkpoint import load_model
    from multibranch.tasks.classification.inference import classify_lines
    from tests.helpers.classification import TEXTS, train_classifier

    ckpt = train_classifier(tmp_path_factory.mktemp("page_classifier"))
    loaded = load_model(ckpt, "cpu", task="classification")
    labels = loaded.config.classifier.labels
    expected = classify_lines(loaded.model, loaded.tokenizer, TEXTS[:2]).tolist()
    for url in _serve(ckpt):
        browser.get(url + "/")
        _wait(browser, lambda d: "labels: colour, number, place" in d.find_element(By.ID, "model-info").text)
        assert browser.find_element(By.ID, "translate").text == "Classify"
        assert not browser.find_element(By.ID, "nbest").is_displayed()
        browser.find_element(By.ID, "source").send_keys("\n".join(TEXTS[:2]))
        browser.find_element(By.ID, "translate").click()
        sentences = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#sentences .sentence"))
        assert len(sentences) == 2
        for sentence, probs in zip(sentences, expected):
            ranked = sorted(zip(labels, probs), key=lambda item: -item[1])
            assert _texts(sentence.find_elements(By.CSS_SELECTOR, ".label .text")) == [name for name, _ in ranked]
            assert _texts(sentence.find_elements(By.CSS_SELECTOR, ".label .score")) == [f"{p:.3f}" for _, p in ranked]
        assert browser.find_element(By.ID, "results-title").text == "Labels"
        assert not browser.find_element(By.ID, "error").is_displayed()
