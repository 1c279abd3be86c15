"""The chat page in a real headless Chromium (Debian's, driven by its chromedriver), against a
real `edgevlm serve` process on 127.0.0.1 with the test models.

One conversation is driven the way a person would: attach a photo, send with Enter, watch the
answer stream, follow up, reload, send a broken file, stop a long answer. A screenshot taken
mid-conversation is saved under build/test-artifacts/.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from .test_app import free_port

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 120

SAMPLE_PHOTO = Path(__file__).resolve().parents[2] / "scripts" / "sample-photo.jpg"


@pytest.fixture(scope="module")
def server(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`edgevlm serve` as a user starts it, on a free loopback port (answers capped at 8 tokens)."""
    yield from _serve(test_models, tmp_path_factory, max_tokens=8)


@pytest.fixture(scope="module")
def long_server(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same with room for long answers: a stream to stop has to last longer than a click."""
    yield from _serve(test_models, tmp_path_factory, max_tokens=2000)


@pytest.fixture(scope="module")
def qwen_server(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Qwen2.5-VL pair: an mtmd family, which lays images out itself (no global view, no tiles)."""
    yield from _serve(test_models, tmp_path_factory, max_tokens=8, pair=("qwen_text", "qwen_mmproj"))


@pytest.fixture(scope="module")
def lfm2_server(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The LFM2-VL pair: an mtmd family whose processor's tiles edgevlm cuts (a grid and a thumbnail)."""
    yield from _serve(test_models, tmp_path_factory, max_tokens=8, pair=("lfm2_text", "lfm2_mmproj"))


def _serve(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, *,
           max_tokens: int, pair: tuple[str, str] = ("text", "mmproj_112")) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("page-cache"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "edgevlm.cli", "serve", "--model", str(test_models[pair[0]]),
         "--mmproj", str(test_models[pair[1]]), "--n-ctx", "2048", "--max-tokens", str(max_tokens),
         "--host", "127.0.0.1", "--port", str(port)], stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, process)
        yield url
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
        assert "Traceback" not in stderr, stderr


def _wait_until_up(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"serve did not come up: {process.stderr.read() if process.stderr else ''}")


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM and CHROMEDRIVER):
        reason = "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        if os.environ.get("EDGEVLM_REQUIRE_BROWSER"):
            pytest.fail(reason)  # CI installs them: a missing browser must not pass quietly
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1100,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _photo(path: Path, width: int = 384) -> Path:
    """The sample photo, made small: the test projector's tiles are 112 px, so this gives a grid."""
    with Image.open(SAMPLE_PHOTO) as photo:
        small = photo.resize((width, round(width * photo.height / photo.width)))
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=90)
    path.write_bytes(buf.getvalue())
    return path


def _open(driver: webdriver.Chrome, url: str) -> None:
    """The page at url with no stored conversation: the module's tests share one browser, and a
    test that runs after another on the same server would otherwise see its turns."""
    driver.get(url)
    driver.execute_script("localStorage.clear()")
    driver.refresh()
    WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "model-name").text)


def _stored(driver: webdriver.Chrome) -> dict:
    return json.loads(driver.execute_script("return localStorage.getItem('edgevlm.chat.v1')"))


def _wait_for_states(driver: webdriver.Chrome, *states: str) -> None:
    """Until the page shows exactly these turn states, in order."""
    def shown(d: webdriver.Chrome) -> bool:
        found = [s.get_attribute("data-state") for s in d.find_elements(By.CSS_SELECTOR, "#chat .turn")]
        return found == list(states)
    WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(shown)


def _send(driver: webdriver.Chrome, text: str, *, attach: Path | None = None) -> None:
    if attach is not None:
        driver.find_element(By.ID, "file-input").send_keys(str(attach))
        WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "attachment").is_displayed())
    box = driver.find_element(By.ID, "prompt")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)  # the keyboard sends; Shift+Enter would be a newline


def _turns(driver: webdriver.Chrome) -> list:
    return driver.find_elements(By.CSS_SELECTOR, "#chat .turn")


def test_the_page_its_files_and_facts(server: str) -> None:
    page = httpx.get(server, headers={"Accept": "text/html"})
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert httpx.get(server).text == "edgevlm is running"  # what clients probing "/" expect
    assert httpx.get(f"{server}/static/app.js").headers["content-type"].startswith("text/javascript")
    for missing in ("nope.js", "index.html", ".hidden.css"):
        reply = httpx.get(f"{server}/static/{missing}")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
    facts = httpx.get(f"{server}/edgevlm/info").json()
    assert facts["model"]["n_ctx"] == 2048 and facts["plan"]["n_ctx"] == 2048
    assert facts["defaults"]["max_tokens"] == 8 and facts["defaults"]["useful_pixels"] > 0


@pytest.mark.slow
def test_a_conversation_with_photos_in_the_page(server: str, browser: webdriver.Chrome,
                                               tmp_path: Path) -> None:
    _open(browser, server)
    assert browser.find_element(By.ID, "model-name").text.startswith("SmolLM2")

    _send(browser, "What is in this photo?", attach=_photo(tmp_path / "photo.jpg"))
    _wait_for_states(browser, "done")
    first = _stored(browser)["turns"][0]
    cols, rows = first["numbers"]["grid"]
    tiles = _turns(browser)[0].find_elements(By.CSS_SELECTOR, ".tile")
    assert cols * rows > 1 and len(tiles) == cols * rows  # the overlay is the grid the server chose
    assert first["answer"] and _turns(browser)[0].find_element(By.CSS_SELECTOR, ".answer").text
    numbers = _turns(browser)[0].find_element(By.CSS_SELECTOR, ".numbers").text
    assert "TTFT" in numbers and "tok/s" in numbers

    _send(browser, "And what colour is it?")
    _wait_for_states(browser, "done", "done")
    summary = _turns(browser)[0].find_element(By.CSS_SELECTOR, ".summary")
    assert not summary.is_displayed() and _stored(browser)["kv"]["images"] > 0  # live for one follow-up
    _send(browser, "Is it old?")
    _wait_for_states(browser, "done", "done", "done")
    assert summary.is_displayed()  # the first image now stands as its summary
    kv = _stored(browser)["kv"]
    assert kv["summaries"] > 0 and kv["images"] == 0
    assert f"/ {kv['n_ctx']}" in browser.find_element(By.ID, "kv-label").text
    summary.click()  # open it, for the screenshot
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "page.png"))

    _send(browser, "What did image 1 show?")  # image 1 comes back for this turn (issue 52)
    _wait_for_states(browser, "done", "done", "done", "done")
    assert "image 1 shown again" in _turns(browser)[3].find_element(By.CSS_SELECTOR, ".numbers").text

    browser.refresh()
    _wait_for_states(browser, "done", "done", "done", "done")
    again = _turns(browser)
    assert again[0].find_element(By.CSS_SELECTOR, ".user-text").text == "What is in this photo?"
    assert len(again[0].find_elements(By.CSS_SELECTOR, ".tile")) == cols * rows
    assert again[0].find_element(By.CSS_SELECTOR, ".summary").is_displayed()

    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    _send(browser, "What about this one?", attach=broken)
    _wait_for_states(browser, "done", "done", "done", "done", "error")
    error = _turns(browser)[4].find_element(By.CSS_SELECTOR, ".image-error")
    assert error.is_displayed() and "image" in error.text.lower()

    _send(browser, "Still there?")  # the refused image is left out; the chat goes on
    _wait_for_states(browser, "done", "done", "done", "done", "error", "done")


def test_an_attached_photo_is_read_before_the_question_is_sent(server: str, browser: webdriver.Chrome,
                                                              tmp_path: Path) -> None:
    """Issue 53: attaching uploads the photo (POST /v1/files) and the server reads it in idle
    time; the chip says "read", and the question that opens the chat with it restores its block
    from the prefix cache, with no encode. The upload is deleted once sent."""
    _open(browser, server)
    assert browser.find_element(By.ID, "model-name").text.startswith("SmolLM2")
    browser.find_element(By.ID, "file-input").send_keys(str(_photo(tmp_path / "read.jpg", width=320)))
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
        lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, "#attachment .read")] == ["read"])
    box = browser.find_element(By.ID, "prompt")
    box.send_keys("What is in this photo?")
    box.send_keys(Keys.ENTER)
    _wait_for_states(browser, "done")
    numbers = _stored(browser)["turns"][0]["numbers"]
    assert numbers["clip_encodes"] == 0 and numbers["prefix_cache"] == "ram" and numbers["visual_tokens"] > 0
    WebDriverWait(browser, 10).until(lambda _d: httpx.get(f"{server}/v1/files").json()["data"] == [])


@pytest.mark.slow
def test_stop_settings_and_a_phone_screen(long_server: str, browser: webdriver.Chrome) -> None:
    _open(browser, long_server)
    browser.find_element(By.ID, "open-settings").click()
    limit = browser.find_element(By.ID, "set-max-tokens")
    limit.send_keys("2000")
    browser.find_element(By.ID, "close-settings").click()

    _send(browser, "Write a very long story.")
    WebDriverWait(browser, WAIT_S, poll_frequency=0.05).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "#chat .turn").get_attribute("data-state") == "streaming")
    browser.find_element(By.ID, "stop").click()
    _wait_for_states(browser, "stopped")
    stopped = _stored(browser)["turns"][0]
    assert stopped["answer"] and stopped.get("numbers") is None  # cut before the last chunk
    assert _stored(browser)["settings"]["maxTokens"] == "2000"

    browser.find_element(By.ID, "open-settings").click()
    limit = browser.find_element(By.ID, "set-max-tokens")
    limit.clear()
    limit.send_keys("8")
    browser.find_element(By.ID, "close-settings").click()
    _send(browser, "A short one now.")  # the server freed the stopped work and answers
    _wait_for_states(browser, "stopped", "done")

    browser.set_window_size(390, 844)
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    assert browser.find_element(By.ID, "send").is_displayed()
    browser.set_window_size(1100, 1000)


def test_an_mtmd_image_is_not_called_a_global_view(qwen_server: str, browser: webdriver.Chrome,
                                                  tmp_path: Path) -> None:
    """Issue 39.16: the page said "global view only" under every Qwen or Gemma photo."""
    _open(browser, qwen_server)
    _send(browser, "What is in this photo?", attach=_photo(tmp_path / "photo.jpg"))
    _wait_for_states(browser, "done")
    caption = _turns(browser)[0].find_element(By.CSS_SELECTOR, ".saw-caption").text
    assert "global view" not in caption and "as its family lays it out" in caption
    assert "mtmd-qwen2.5vl_merger" in caption


def test_an_mtmd_familys_processor_tiles_are_drawn_and_named(lfm2_server: str, browser: webdriver.Chrome,
                                                             tmp_path: Path) -> None:
    """LFM2-VL cuts a 16:9 photo into its processor's 2x1 tiles and a thumbnail: the page draws
    the grid over the photo (the tiles are the photo stretched onto it, so they split it evenly)
    and says how it was cut, not that the family showed it whole."""
    _open(browser, lfm2_server)
    _send(browser, "What is in this photo?", attach=_photo(tmp_path / "photo.jpg", 1280))
    _wait_for_states(browser, "done")
    figure = _turns(browser)[0].find_element(By.CSS_SELECTOR, "figure.saw")
    assert figure.get_attribute("data-grid") == "2x1"
    assert len(figure.find_elements(By.CSS_SELECTOR, ".tile")) == 2
    caption = figure.find_element(By.CSS_SELECTOR, ".saw-caption").text
    assert "2×1 tiles and a thumbnail, as its processor cuts them" in caption and "mtmd-lfm2" in caption


def test_several_photos_and_a_pdf_go_in_one_message(qwen_server: str, browser: webdriver.Chrome,
                                                    tmp_path: Path) -> None:
    """Attach several files at once (and drop one again): the photos go as image_url parts and the
    PDF as a file part, in the order chosen; the server counts every image and page."""
    from ..vision.test_documents import write_pdf

    _open(browser, qwen_server)
    files = [_photo(tmp_path / "a.jpg"), _photo(tmp_path / "b.jpg", 300), _photo(tmp_path / "c.jpg", 200),
             write_pdf(tmp_path / "notes.pdf", [(90, 120), (80, 80)])]
    browser.find_element(By.ID, "file-input").send_keys("\n".join(str(f) for f in files))
    chips = lambda d: d.find_elements(By.CSS_SELECTOR, "#attachment .chip")  # noqa: E731
    WebDriverWait(browser, 10).until(lambda d: len(chips(d)) == 4)
    chips(browser)[2].find_element(By.TAG_NAME, "button").click()  # c.jpg is not wanted after all
    names = [c.find_element(By.CSS_SELECTOR, ".name").text for c in chips(browser)]
    assert names == ["a.jpg", "b.jpg", "notes.pdf"]
    _send(browser, "Compare them.")
    _wait_for_states(browser, "done")
    turn = _stored(browser)["turns"][0]
    assert [a["kind"] for a in turn["images"]] == ["image", "image", "pdf"]
    assert len(turn["numbers"]["image_tokens"]) == 4  # two photos, two pages
    shown = _turns(browser)[0]
    assert shown.find_element(By.CSS_SELECTOR, ".saw").is_displayed()  # the first photo, with its layout
    beside = [c.text for c in shown.find_elements(By.CSS_SELECTOR, ".more-images .name")]
    assert beside == ["b.jpg", "notes.pdf"]
    assert not browser.find_element(By.ID, "attachment").is_displayed()  # sent: the composer is empty


def test_a_video_is_sent_and_its_frames_shown_under_the_answer(qwen_server: str, browser: webdriver.Chrome,
                                                               tmp_path: Path) -> None:
    """A clip attached in the page goes as a video_url part; the page asks for the prefill's
    progress (kept on the turn) and, once answered, shows the frames the model saw, block by
    block (Qwen-VL: two frames to a block)."""
    from ..vision.test_video import moving_square, write_clip

    _open(browser, qwen_server)
    _send(browser, "What moves?", attach=write_clip(tmp_path / "clip.mp4", 4, draw=moving_square))
    _wait_for_states(browser, "done")
    turn = _stored(browser)["turns"][0]
    assert [a["kind"] for a in turn["images"]] == ["video"]
    assert turn["progress"]["tokens_total"] >= turn["progress"]["tokens_done"] > 0
    assert len(turn["numbers"]["video"]) == 4  # 4 s at 2 fps: 8 frames, two to a block
    timeline = _turns(browser)[0].find_element(By.CSS_SELECTOR, ".timeline")
    assert timeline.is_displayed()
    assert timeline.text == ("video: 8 frames in 4 blocks, at 0:00.3+0:00.8 · 0:01.3+0:01.8 · "
                             "0:02.3+0:02.8 · 0:03.3+0:03.8")


def test_found_boxes_are_drawn_over_the_photo(test_models: dict[str, Path], browser: webdriver.Chrome,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: "/find the red square" in the page asks for boxes; the server puts the model's
    answer (scripted here: the test pair's words are random) on the photo, and the page draws it
    where the square is."""
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.llama.sequence import EngineSequence
    from edgevlm.runtime.loading import ModelFlags, load
    from edgevlm.server.launch import ServeSettings, build_state

    from ..describe.test_grounding import SQUARE
    from ..vision.test_boxes import smart_resize
    from .test_app import serving

    upright = Image.new("RGB", (1200, 1600), (190, 190, 190))
    upright.paste((220, 30, 30), SQUARE)
    photo = tmp_path / "square.png"
    upright.save(photo)
    answers = ["[]"]  # every answer the model gives, summaries of earlier turns' photos included

    def generate(self: EngineSequence, max_tokens: int, sampling: object = None) -> Iterator[str]:
        tokens = self.tokenize(answers[-1])[:max_tokens]
        self.eval_text(tokens)
        self.last_completion_tokens = list(tokens)
        yield self.detokenize(tokens)

    monkeypatch.setattr(EngineSequence, "generate", generate)
    loaded = load(ModelFlags(model=str(test_models["qwen_text"]), mmproj=str(test_models["qwen_mmproj"]),
                             n_ctx=4096, n_gpu_layers=0))
    try:
        chat = ChatSettings(max_tokens=256, summary="answer", pool=None)
        state = build_state(loaded, ServeSettings(chat=chat, cache=False))
        with serving(state) as url:
            browser.get(url)
            WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "model-name").text)
            shown = None
            for attempt in range(2):  # once to learn the size the model is shown, once with its boxes
                if shown is not None:
                    height, width = smart_resize(shown[1], shown[0])
                    box = [round(v * side / full) for v, side, full in
                           zip(SQUARE, (width, height, width, height), (1200, 1600, 1200, 1600), strict=True)]
                    answers.append(json.dumps([{"bbox_2d": box, "label": "red square"}]))
                _send(browser, "/find the red square", attach=photo)
                _wait_for_states(browser, *["done"] * (attempt + 1))
                shown = _stored(browser)["turns"][-1]["numbers"]["canvas"]
            found = _turns(browser)[-1].find_elements(By.CSS_SELECTOR, ".boxes .box")
            assert [b.get_attribute("data-label") for b in found] == ["red square"]
            image = _turns(browser)[-1].find_element(By.CSS_SELECTOR, ".photo").rect
            drawn = found[0].rect
            for got, want, side in ((drawn["x"] - image["x"], SQUARE[0], 1200),
                                    (drawn["y"] - image["y"], SQUARE[1], 1600),
                                    (drawn["width"], SQUARE[2] - SQUARE[0], 1200)):
                assert abs(got / image["width" if side == 1200 else "height"] - want / side) < 0.02
        state.scheduler.close()
    finally:
        loaded.engine.close()
