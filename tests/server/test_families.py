"""`edgevlm serve` on another family than LLaVA: the Qwen2.5-VL test pair answers the openai and
ollama clients with images, prompted by its own chat template, the images through mtmd's layout."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgevlm.chat.settings import ChatSettings
from edgevlm.server.launch import ServeSettings, build_state
from edgevlm.server.turns import ServerState

from .test_app import data_url, images_content, photo_bytes, serving


@pytest.fixture(scope="module")
def qwen_server(test_models: dict[str, Path],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerState]]:
    from edgevlm.runtime.loading import ModelFlags, load

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("qwen-cache")))
        loaded = load(ModelFlags(model=str(test_models["qwen_text"]), mmproj=str(test_models["qwen_mmproj"]),
                                 n_ctx=2048, n_gpu_layers=0, answer_tokens=16))
        assert loaded.prompt_format.name == "qwen2vl template"
        state = build_state(loaded, ServeSettings(chat=ChatSettings(max_tokens=16, pool=None),
                                                  max_queue=4, cache=True))
        with serving(state) as url:
            yield url, state
        loaded.engine.close()


def test_openai_with_images_on_the_qwen_pair(qwen_server: tuple[str, ServerState]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{qwen_server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    content = [{"type": "text", "text": "What is it?"},
               {"type": "image_url", "image_url": {"url": data_url(41)}}]
    first = client.chat.completions.create(model="", messages=[{"role": "user", "content": content}])
    extra = first.model_extra["edgevlm"]
    assert first.choices[0].message.content and extra["layout"] == "mtmd-qwen2.5vl_merger"
    assert extra["visual_tokens"] > 0 and first.usage.prompt_tokens > extra["visual_tokens"]
    # The same history resent with a follow-up: the image's block is reused, not decoded again.
    follow = client.chat.completions.create(model="", messages=[
        {"role": "user", "content": content},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And the colours?"}])
    assert follow.choices[0].message.content
    assert follow.usage.prompt_tokens_details.cached_tokens > extra["visual_tokens"]


def test_ollama_with_images_on_the_qwen_pair(qwen_server: tuple[str, ServerState]) -> None:
    import ollama

    client, name = ollama.Client(host=qwen_server[0], timeout=120), qwen_server[1].model.id
    asked = [{"role": "user", "content": "What?", "images": [photo_bytes(42)]}]
    reply = client.chat(model=name, messages=asked)
    assert reply.done and reply.message.content and reply.prompt_eval_count > 8
    parts = list(client.chat(model=name, stream=True, messages=asked))
    assert "".join(p.message.content for p in parts) == reply.message.content


@pytest.mark.parametrize(("family", "kind", "least_cached"), [("lfm2", "hybrid", 100),
                                                             ("gemma", "sliding-window", 30)])
def test_a_resent_history_on_checkpointed_memory_reuses_its_cache(
        test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, family: str, kind: str,
        least_cached: int) -> None:
    """LFM2 (hybrid memory, its recurrent state not cut at a position) and Gemma 3 with a window's
    worth of cache (--no-swa-full, old positions gone): ten turns, the whole history resent each
    time with a new photo every other turn; the cached prefix grows."""
    from openai import OpenAI

    from edgevlm.runtime.loading import ModelFlags, load

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp(f"{family}-cache")))
        loaded = load(ModelFlags(model=str(test_models[f"{family}_text"]),
                                 mmproj=str(test_models[f"{family}_mmproj"]), n_ctx=4096, n_gpu_layers=0,
                                 answer_tokens=8, swa_full=False))
        assert loaded.engine.memory.name.value == kind
        assert not loaded.engine.memory.can_cut(swa_full=loaded.engine.swa_full)
        state = build_state(loaded, ServeSettings(chat=ChatSettings(max_tokens=8, pool=None), max_queue=4,
                                                  cache=False))
        with serving(state) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
            messages: list[dict[str, object]] = []
            cached = []
            for turn in range(10):
                content: object = f"And turn {turn}?"
                if turn % 2 == 0:
                    content = [{"type": "text", "text": f"What is in photo {turn}?"},
                               {"type": "image_url", "image_url": {"url": data_url(50 + turn)}}]
                messages.append({"role": "user", "content": content})
                reply = client.chat.completions.create(model="", messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        loaded.engine.close()
    assert cached[0] <= 1 and all(c > least_cached for c in cached[1:]), cached  # never the whole prompt
    assert cached[-1] > 2 * cached[1], cached


def test_two_images_in_one_message_from_both_clients_on_the_qwen_pair(
        qwen_server: tuple[str, ServerState]) -> None:
    """Several image parts in one OpenAI message, several `images` in one Ollama message: both
    shown, in order, each counted in the edgevlm block; the history resent keeps their cache."""
    import ollama
    from openai import OpenAI

    client = OpenAI(base_url=f"{qwen_server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    content = images_content("What changed?", 43, 44)
    first = client.chat.completions.create(model="", messages=[{"role": "user", "content": content}])
    extra = first.model_extra["edgevlm"]
    assert first.choices[0].message.content and len(extra["image_tokens"]) == 2
    assert sum(extra["image_tokens"]) == extra["visual_tokens"] and extra["clip_encodes"] == 2
    follow = client.chat.completions.create(model="", messages=[
        {"role": "user", "content": content},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Which is brighter?"}])
    assert follow.usage.prompt_tokens_details.cached_tokens > extra["visual_tokens"]
    assert follow.model_extra["edgevlm"]["clip_encodes"] == 0

    reply = ollama.Client(host=qwen_server[0], timeout=120).chat(model=qwen_server[1].model.id, messages=[
        {"role": "user", "content": "Compare.", "images": [photo_bytes(45), photo_bytes(46)]}])
    assert reply.done and reply.message.content and reply.prompt_eval_count > sum(extra["image_tokens"]) // 2


def test_a_video_url_is_read_as_its_frames_and_ollama_refuses_a_video(qwen_server: tuple[str, ServerState],
                                                                       tmp_path: Path) -> None:
    """The openai client sends a clip as a `video_url` data URL (and as llama-server's
    `input_video`): up to 8 blocks spread over it are shown, each after its time (Qwen-VL: two
    frames to a block, 16 frames at most). The Ollama API has no video: a 400 that says so."""
    import base64

    import ollama
    from openai import BadRequestError, OpenAI

    from ..vision.test_video import moving_square, write_clip

    raw = write_clip(tmp_path / "clip.mp4", 12, draw=moving_square).read_bytes()
    data = base64.b64encode(raw).decode()
    client = OpenAI(base_url=f"{qwen_server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    for part in ({"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data}"}},
                 {"type": "input_video", "input_video": {"data": data, "format": "mp4"}}):
        answer = client.chat.completions.create(model="", messages=[
            {"role": "user", "content": [part, {"type": "text", "text": "What moves?"}]}])
        extra = answer.model_extra["edgevlm"]
        assert answer.choices[0].message.content
        assert len(extra["image_tokens"]) == 8  # 12 s: 16 frames (at most 2 fps), two to a block
        assert sum(extra["image_tokens"]) == extra["visual_tokens"]
    with pytest.raises(BadRequestError) as broken:
        client.chat.completions.create(model="", messages=[{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data[:300]}"}}]}])
    assert broken.value.body["param"] == "messages[0].content[0].video_url.url"
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=qwen_server[0], timeout=120).chat(model=qwen_server[1].model.id, messages=[
            {"role": "user", "content": "What moves?", "images": [raw]}])
    assert refused.value.status_code == 400 and "video" in refused.value.error


def test_a_streamed_video_reports_its_prefill_and_its_frames(qwen_server: tuple[str, ServerState],
                                                            tmp_path: Path) -> None:
    """With `edgevlm.progress` the stream carries the prefill's progress (chunks with an empty
    delta) before the first word, the tokens only growing; the last chunk's `video` says each
    block's frame times (Qwen-VL: two frames to a block) and tokens. Without it, no such chunk."""
    import base64
    import json

    import httpx

    from ..vision.test_video import moving_square, write_clip

    raw = write_clip(tmp_path / "clip.mp4", 6, draw=moving_square).read_bytes()
    url = f"data:video/mp4;base64,{base64.b64encode(raw).decode()}"
    message = {"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                           {"type": "text", "text": "What moves?"}]}

    def chunks(extra: dict[str, object]) -> list[dict]:
        body = {"messages": [message], "stream": True, "max_tokens": 4, **extra}
        with httpx.stream("POST", f"{qwen_server[0]}/v1/chat/completions", json=body, timeout=120) as reply:
            assert reply.status_code == 200
            lines = [line[5:].strip() for line in reply.iter_lines() if line.startswith("data:")]
        return [json.loads(line) for line in lines if line != "[DONE]"]

    seen = chunks({"edgevlm": {"progress": True}})
    progress = [c["edgevlm"]["progress"] for c in seen if "progress" in c.get("edgevlm", {})]
    first_word = next(k for k, c in enumerate(seen) if c["choices"][0]["delta"].get("content"))
    assert progress and all("progress" not in c.get("edgevlm", {}) for c in seen[first_word:])
    done = [p["tokens_done"] for p in progress]
    assert done == sorted(done) and progress[-1]["tokens_total"] > 0
    video = seen[-1]["edgevlm"]["video"]
    assert [b["times_s"] for b in video] == [[0.25, 0.75], [1.25, 1.75], [2.25, 2.75], [3.25, 3.75],
                                             [4.25, 4.75], [5.25, 5.75]]  # 6 s at 2 fps, in pairs
    assert [b["tokens"] for b in video] == seen[-1]["edgevlm"]["image_tokens"]
    plain = chunks({})
    assert not any("progress" in c.get("edgevlm", {}) for c in plain)


def test_a_request_sets_its_videos_rate_and_frame_tokens(qwen_server: tuple[str, ServerState],
                                                        tmp_path: Path) -> None:
    """`edgevlm.fps` and `edgevlm.frame_tokens` for one request: 0.5 fps on a 6 s clip is 3 frames
    (a merged pair and one alone), each block at most 16 tokens; a bad value is a 400 naming it."""
    import base64

    import httpx

    from ..vision.test_video import moving_square, write_clip

    raw = write_clip(tmp_path / "clip.mp4", 6, size=(320, 240), draw=moving_square).read_bytes()
    url = f"data:video/mp4;base64,{base64.b64encode(raw).decode()}"
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "What moves?"}]}]}
    plain = httpx.post(f"{qwen_server[0]}/v1/chat/completions", json=body, timeout=120).json()["edgevlm"]
    asked = httpx.post(f"{qwen_server[0]}/v1/chat/completions", timeout=120,
                       json={**body, "edgevlm": {"fps": 0.5, "frame_tokens": 16}}).json()["edgevlm"]
    assert [b["times_s"] for b in asked["video"]] == [[1.0, 3.0], [5.0]]
    assert max(asked["image_tokens"]) <= 16 < max(plain["image_tokens"])
    bad = httpx.post(f"{qwen_server[0]}/v1/chat/completions", timeout=120,
                     json={**body, "edgevlm": {"fps": 0}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "edgevlm.fps"


def test_a_pdf_file_part_shows_its_pages_and_the_ollama_api_refuses_one(
        qwen_server: tuple[str, ServerState], tmp_path: Path) -> None:
    """The openai client sends a two-page PDF as a `file` part: each page is an image of the
    message, with its own tokens. The Ollama API has no documents: a 400 that says so."""
    import base64

    import ollama
    from openai import BadRequestError, OpenAI

    from ..vision.test_documents import write_pdf

    # Small pages (a label, a card): a few views each, so the test stays quick on a CPU.
    pdf = base64.b64encode(write_pdf(tmp_path / "two.pdf", [(90, 120), (80, 80)]).read_bytes()).decode()
    client = OpenAI(base_url=f"{qwen_server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    file_part = {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{pdf}",
                                          "filename": "two.pdf"}}
    answer = client.chat.completions.create(model="", messages=[
        {"role": "user", "content": [file_part, {"type": "text", "text": "What is on each page?"}]}])
    extra = answer.model_extra["edgevlm"]
    assert answer.choices[0].message.content and len(extra["image_tokens"]) == 2
    assert sum(extra["image_tokens"]) == extra["visual_tokens"] and min(extra["image_tokens"]) > 0
    with pytest.raises(BadRequestError) as damaged:
        client.chat.completions.create(model="", messages=[{"role": "user", "content": [
            {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{pdf[:200]}"}}]}])
    assert damaged.value.body["param"] == "messages[0].content[0].file.file_data"
    assert "not a readable PDF" in damaged.value.body["message"]
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=qwen_server[0], timeout=120).chat(model=qwen_server[1].model.id, messages=[
            {"role": "user", "content": "Read it.", "images": [base64.b64decode(pdf)]}])
    assert refused.value.status_code == 400 and "Ollama API takes images only" in refused.value.error


@pytest.mark.parametrize("family", ["qwen", "qwen3", "smolvlm"])
def test_a_follow_up_to_a_video_reuses_the_cache(test_models: dict[str, Path],
                                                 tmp_path_factory: pytest.TempPathFactory, family: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Issue 49.15: a follow-up to a video message re-prefilled everything (the Qwen pair: 1,247
    prompt tokens, none cached, against 299 for the video turn): the frames were matched by their
    times' names against records keyed by the file, and each frame had a summary of its own.
    A window is now one entry and one summary; the follow-up, sent at once or after the summary,
    reuses what the cache holds."""
    import base64
    import logging

    from openai import OpenAI

    from edgevlm.runtime.loading import ModelFlags, load

    from ..vision.test_video import moving_square, write_clip

    caplog.set_level(logging.WARNING)
    raw = write_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", 12, draw=moving_square).read_bytes()
    data = base64.b64encode(raw).decode()
    video = {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data}"}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp(f"{family}-video-cache")))
        loaded = load(ModelFlags(model=str(test_models[f"{family}_text"]),
                                 mmproj=str(test_models[f"{family}_mmproj"]), n_ctx=4096, n_gpu_layers=0,
                                 answer_tokens=16))
        state = build_state(loaded, ServeSettings(chat=ChatSettings(max_tokens=16, pool=None), max_queue=4,
                                                  cache=True))
        with serving(state) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
            messages: list[dict[str, object]] = [
                {"role": "user", "content": [{"type": "text", "text": "What happens?"}, video]}]
            first = client.chat.completions.create(model="", messages=messages)
            messages.append({"role": "assistant", "content": first.choices[0].message.content})
            cached = []
            for question in ("And then?", "What colour is it?"):  # at once, then after the summary
                messages.append({"role": "user", "content": question})
                reply = client.chat.completions.create(model="", messages=messages)
                cached.append(reply.usage.prompt_tokens_details.cached_tokens)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                state.scheduler.drain()
            state.scheduler.session.conversation.check()
            summaries = reply.model_extra["edgevlm"]["summaries"]
        loaded.engine.close()
    assert cached[0] >= first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)
    assert cached[1] >= reply.usage.prompt_tokens - 20, (cached, reply.usage.prompt_tokens)
    assert len(summaries) == 1 and summaries[0]["summary"] is not None  # one window, one summary
    assert not [r for r in caplog.records if "summary failed" in r.getMessage()]
