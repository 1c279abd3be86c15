"""`describe --find` on the Qwen2.5-VL and Qwen3-VL test pairs (issue 38): the model's boxes, in
pixels of the image as its processor resized it (Qwen3-VL: thousandths of each side), come back
in the original photo's pixels, upright; --draw
writes them on the photo; a family without a box format is refused before loading."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from edgevlm.llama.sequence import EngineSequence
from edgevlm.values.sampling import Sampling

from ..conftest import invoke_cli
from ..vision.test_boxes import smart_resize

# Where the red square is on the photo as a viewer sees it (upright: 1200 wide, 1600 high).
SQUARE = (300, 500, 700, 1100)


def _sideways_photo(path: Path) -> Path:
    """A photo stored 1600x1200 with EXIF orientation 6: shown upright, 1200x1600, with a red
    square at SQUARE."""
    upright = Image.new("RGB", (1200, 1600), (190, 190, 190))
    ImageDraw.Draw(upright).rectangle(SQUARE, fill=(220, 30, 30))
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # orientation 6 turns it back
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(path, exif=exif, quality=95)
    return path


@pytest.fixture()
def scripted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The answers the model gives, in turn: decoded into the cache as a real answer is."""
    answers: list[str] = []

    def generate(self: EngineSequence, max_tokens: int, sampling: Sampling | None = None) -> Iterator[str]:
        text = answers.pop(0)
        tokens = self.tokenize(text)[:max_tokens]
        self.eval_text(tokens)
        self.last_completion_tokens = list(tokens)
        yield self.detokenize(tokens)

    monkeypatch.setattr(EngineSequence, "generate", generate)
    yield answers


def test_find_gives_boxes_on_the_upright_photo_and_draws_them(test_models: dict[str, Path], tmp_path: Path,
                                                              scripted: list[str]) -> None:
    photo = _sideways_photo(tmp_path / "sideways.jpg")
    pair = ["--model", str(test_models["qwen_text"]), "--mmproj", str(test_models["qwen_mmproj"]),
            "--n-ctx", "4096"]
    scripted.append("[]")
    first = json.loads(invoke_cli("describe", str(photo), "--find", "the red square", *pair, "--json").stdout)
    shown = tuple(first["shown_size"])
    assert first["boxes"] == [] and shown[1] > shown[0]  # handed to the model upright
    # The model answers in pixels of the image as Qwen's processor resized the shown one.
    height, width = smart_resize(shown[1], shown[0])
    model_box = [round(v * side / full) for v, side, full in
                 zip(SQUARE, (width, height, width, height), (1200, 1600, 1200, 1600), strict=True)]
    scripted.append(json.dumps([{"bbox_2d": model_box, "label": "red square"}]))
    drawn = tmp_path / "boxes.png"
    done = invoke_cli("describe", str(photo), "--find", "the red square", *pair, "--json",
                      "--draw", str(drawn))
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert [b["label"] for b in row["boxes"]] == ["red square"] and row["boxes"][0]["model_box"] == model_box
    unit = (1200 / width, 1600 / height)  # photo pixels per pixel the model saw
    for got, want, step in zip(row["boxes"][0]["box"], SQUARE, (*unit, *unit), strict=True):
        assert abs(got - want) <= step / 2 + 1  # within a pixel of the square, beyond the model's rounding
    image = Image.open(drawn)
    assert image.size == (1200, 1600)  # the original, upright, full size
    assert image.getpixel((SQUARE[0], (SQUARE[1] + SQUARE[3]) // 2))[:3] == (255, 40, 40)  # the left edge
    scripted.append(json.dumps([{"bbox_2d": model_box, "label": "red square"}]))
    text = invoke_cli("describe", str(photo), "--find", "the red square", *pair)
    line = text.stdout.strip()
    assert line.startswith("red square: ") and len(line.split(", ")) == 4  # the boxes, not the raw answer


def test_qwen3_answers_in_thousandths_of_the_photo(test_models: dict[str, Path], tmp_path: Path,
                                                  scripted: list[str]) -> None:
    """Qwen3-VL (its test pair) writes the same JSON in thousandths of each side, whatever size the
    photo was shown at: the box lands on the upright photo within a thousandth of a side."""
    photo = _sideways_photo(tmp_path / "sideways.jpg")
    pair = ["--model", str(test_models["qwen3_text"]), "--mmproj", str(test_models["qwen3_mmproj"]),
            "--n-ctx", "4096"]
    model_box = [round(1000 * v / side) for v, side in zip(SQUARE, (1200, 1600, 1200, 1600), strict=True)]
    scripted.append(json.dumps([{"bbox_2d": model_box, "label": "red square"}]))
    done = invoke_cli("describe", str(photo), "--find", "the red square", *pair, "--json")
    assert done.returncode == 0, done.stderr
    [box] = json.loads(done.stdout)["boxes"]
    assert box["model_box"] == model_box
    for got, want, side in zip(box["box"], SQUARE, (1200, 1600, 1200, 1600), strict=True):
        assert abs(got - want) <= side / 1000 + 1


def test_find_is_refused_in_one_line_where_it_cannot_work(test_models: dict[str, Path],
                                                          tmp_path: Path) -> None:
    photo = _sideways_photo(tmp_path / "p.jpg")
    llava = ["--model", str(test_models["text"]), "--mmproj", str(test_models["mmproj_112"])]
    qwen = ["--model", str(test_models["qwen_text"]), "--mmproj", str(test_models["qwen_mmproj"])]
    for args, message in [
        ([*llava, "--find", "a cat"], "llava-1.5 models write no boxes"),
        ([*qwen, "--find", "a cat", "--tags"], "--find gives its answer's shape"),
        ([*qwen, "--find", "a cat", "--ask", "Why?"], "--find asks its own question"),
        ([*qwen, "--draw", str(tmp_path / "out.png")], "--draw draws the boxes --find gives"),
        ([*qwen, "--find", "a cat", "--draw", str(tmp_path)], "is a directory"),
    ]:
        done = invoke_cli("describe", str(photo), *args)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, lines)


def test_the_api_gives_boxes_on_the_photo_in_the_edgevlm_block(test_models: dict[str, Path], tmp_path: Path,
                                                              scripted: list[str]) -> None:
    """The OpenAI API with edgevlm's own `find`: the family's question, its grammar, and the boxes
    in the photo's upright pixels in the `edgevlm` block."""
    import base64

    from openai import OpenAI

    from edgevlm.chat.settings import ChatSettings
    from edgevlm.runtime.loading import ModelFlags, load
    from edgevlm.server.launch import ServeSettings, build_state

    from ..server.test_app import serving

    photo = _sideways_photo(tmp_path / "sideways.jpg")
    url = "data:image/jpeg;base64," + base64.b64encode(photo.read_bytes()).decode()
    loaded = load(ModelFlags(model=str(test_models["qwen_text"]), mmproj=str(test_models["qwen_mmproj"]),
                             n_ctx=4096, n_gpu_layers=0))
    try:
        # Summaries from the answer: every generate call is a scripted answer here.
        chat = ChatSettings(max_tokens=64, summary="answer", pool=None)
        state = build_state(loaded, ServeSettings(chat=chat, cache=False))
        with serving(state) as base:
            client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
            content = [{"type": "image_url", "image_url": {"url": url}}]

            def ask(find: str) -> dict[str, object]:
                reply = client.chat.completions.create(
                    model="", messages=[{"role": "user", "content": content}],
                    extra_body={"edgevlm": {"find": find}})
                return reply.model_extra["edgevlm"]

            scripted.append("[]")
            shown = ask("the red square")
            assert shown["boxes"] == []
            height, width = smart_resize(shown["canvas"][1], shown["canvas"][0])
            model_box = [round(v * side / full) for v, side, full in
                         zip(SQUARE, (width, height, width, height), (1200, 1600, 1200, 1600), strict=True)]
            scripted.append(json.dumps([{"bbox_2d": model_box, "label": "red square"}]))
            found = ask("the red square")["boxes"]
            assert [b["label"] for b in found] == ["red square"]
            assert all(abs(got - want) <= 1200 / width / 2 + 1 for got, want in zip(found[0]["box"], SQUARE,
                                                                                     strict=True))
            state.scheduler.close()
    finally:
        loaded.engine.close()


def test_find_keeps_max_tokens_asks_in_plain_words_and_holds_the_frames_range(test_models: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    """Issue 49.17: --find wrote 622 tokens for --max-tokens 64 (the 16 boxes' room replaced it),
    asked "Locate every the yellow square", and let Qwen3-VL write coordinates to 9999 where its
    convention ends at 1000. The boxes an answer may hold are fitted to --max-tokens instead."""
    from edgevlm.families.qwen_vl import qwen3_grounding
    from edgevlm.models.gguf import read_projector
    from edgevlm.vision.boxes import BOX_TOKENS, BoxFrame, boxes_within

    grounding = qwen3_grounding(read_projector(test_models["qwen3_mmproj"]))
    assert grounding.question("the yellow square").startswith("Locate every yellow square in the image")
    assert grounding.question("every street sign").startswith("Locate every street sign in")
    per_mille = grounding.schema()["items"]["properties"]["bbox_2d"]["items"]
    assert grounding.frame is BoxFrame.PER_MILLE and per_mille["maximum"] == 1000
    assert boxes_within(64) == 1 and boxes_within(8 + 3 * BOX_TOKENS) == 3 and boxes_within(10**6) == 16
    pair = ["--model", str(test_models["qwen3_text"]), "--mmproj", str(test_models["qwen3_mmproj"]),
            "--n-ctx", "4096"]
    done = invoke_cli("describe", str(_sideways_photo(tmp_path / "p.jpg")), "--find", "the red square", *pair,
                      "--json", "--max-tokens", "64", "--temperature", "1", "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["completion_tokens"] <= 64
