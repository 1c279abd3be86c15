"""`edgevlm serve` in-process on 127.0.0.1, driven by the official openai and ollama clients.

The server's flow (routes, history, slots, the queue, caches, the summary swap, cancelling)
runs on a fake sequence (tests/fakes.py) with the test LLaVA pair's facts, plan and prompt
format: token counts, cache reuse and projector runs are counted as a real engine counts them,
in milliseconds. What llama.cpp itself does under the server (grammars, real answers) is tested
with a real engine in test_clients.py and test_families.py. Requests are bounded in number and time.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import ollama
import pytest
import uvicorn
from openai import OpenAI
from PIL import Image

from edgevlm.chat.settings import ChatSettings
from edgevlm.server.app import create_app, uvicorn_config
from edgevlm.server.launch import ServeSettings, build_state
from edgevlm.server.turns import ServerState

from ..fakes import fake_loaded

MAX_TOKENS = 12  # the server's --max-tokens: the default, and the cap on a request's max_tokens


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def photo_bytes(seed: int, size: tuple[int, int] = (448, 336), fmt: str = "PNG") -> bytes:
    """Noise, so no two photos (or tiles) share projector rows."""
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(photo_bytes(seed)).decode()


def images_content(text: str, *seeds: int, detail: str = "auto") -> list[dict[str, object]]:
    """An OpenAI user message's content: the text, then one image part per seed, in order."""
    parts = [{"type": "image_url", "image_url": {"url": data_url(seed), "detail": detail}} for seed in seeds]
    return [{"type": "text", "text": text}, *parts]


def image_message(text: str, seed: int, detail: str = "auto") -> dict[str, object]:
    return {"role": "user", "content": images_content(text, seed, detail=detail)}


@contextlib.contextmanager
def serving(state: ServerState) -> Iterator[str]:
    """The app on a free loopback port, in a thread, until the block ends."""
    port = free_port()
    server = uvicorn.Server(uvicorn_config(create_app(state), host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def loaded(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    # Module fixtures start before the per-test isolation: give this module its own cache folder.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("server-cache")))
        yield fake_loaded(test_models["text"], test_models["mmproj_112"], answer_tokens=MAX_TOKENS,
                          step_s=0.002)


@pytest.fixture(scope="module")
def server(loaded: object) -> Iterator[tuple[str, ServerState]]:
    state = build_state(loaded, ServeSettings(chat=ChatSettings(max_tokens=MAX_TOKENS, pool=None),
                                              max_queue=8, cache=True))
    assert "server-cache" in str(state.scheduler.session.conversation.blocks.encode.folder)  # not the user's
    with serving(state) as url:
        yield url, state


@pytest.fixture()
def client(server: tuple[str, ServerState]) -> OpenAI:
    return OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)


def _checked(state: ServerState) -> None:
    """Wait for the worker (the summary swap runs after the reply), then the ledger invariant."""
    state.scheduler.drain()
    state.scheduler.session.conversation.check()


def test_models_are_listed(client: OpenAI, server: tuple[str, ServerState]) -> None:
    assert [m.id for m in client.models.list().data] == [server[1].model.id]


def test_a_photo_answered_whole_and_streamed_alike(client: OpenAI, server: tuple[str, ServerState]) -> None:
    messages = [image_message("What is in this photo?", seed=1)]
    whole = client.chat.completions.create(model=server[1].model.id, messages=messages, temperature=0)
    numbers = whole.model_extra["edgevlm"]
    assert whole.choices[0].message.content and whole.usage.completion_tokens > 0
    assert numbers["visual_tokens_live"] == numbers["visual_tokens"] > 0
    assert numbers["clip_encodes"] == 1 + numbers["n_tiles"] and numbers["ttft_s"] > 0
    _checked(server[1])
    chunks = list(client.chat.completions.create(model=server[1].model.id, messages=messages,
                                                 temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content  # trimmed alike
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.model_extra["edgevlm"]["clip_encodes"] == 0  # the same photo: rows from the cache
    _checked(server[1])


def test_pool_is_asked_per_request_and_placed_on_the_canvas(client: OpenAI) -> None:
    reply = client.chat.completions.create(model="", messages=[image_message("What is this?", seed=9)],
                                           extra_body={"edgevlm": {"pool": 2}})
    numbers = reply.model_extra["edgevlm"]
    cols, rows = numbers["grid"]
    assert numbers["n_tiles"] == cols * rows > 0 and numbers["pool"] == 2
    canvas_w, canvas_h = numbers["canvas"]
    x, y, width, height = numbers["image_box"]
    assert (canvas_w, canvas_h) == (cols * 112, rows * 112)  # the test projector's 112 px tiles
    assert 0 <= x and x + width <= canvas_w and 0 <= y and y + height <= canvas_h


def test_merge_is_asked_per_request(client: OpenAI) -> None:
    """edgevlm.merge: each view's tokens merged to a quarter (a view's rounding at most), a new
    prefix (the merged block is another block), and refused with OCR unless OCR is named."""
    messages = [image_message("What is this?", seed=11)]
    whole = client.chat.completions.create(model="", messages=messages).model_extra["edgevlm"]
    merged = client.chat.completions.create(model="", messages=messages,
                                            extra_body={"edgevlm": {"merge": 0.25}}).model_extra["edgevlm"]
    views = 1 + whole["n_tiles"]
    assert 0 < merged["visual_tokens"] <= 0.25 * whole["visual_tokens"] + views
    assert merged["clip_encodes"] == 0 and merged["prefix_cache"] != "ram"  # rows cached, not the KV
    assert merged["merge"] == 0.25 and whole["merge"] is None
    for extra in ({"merge": 2}, {"merge": "0.25", "detail": "ocr"}):
        body = {"messages": messages, "edgevlm": extra}
        reply = httpx.post(f"{client.base_url}chat/completions", json=body)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "edgevlm.merge" and "Traceback" not in reply.text
    named = client.chat.completions.create(model="", messages=messages,
                                           extra_body={"edgevlm": {"merge": "0.25:ocr", "detail": "ocr"}})
    assert named.model_extra["edgevlm"]["visual_tokens"] <= 0.25 * whole["visual_tokens"] + views


def test_a_follow_up_reuses_the_cache(client: OpenAI, server: tuple[str, ServerState]) -> None:
    messages = [image_message("What is this?", seed=3)]
    first = client.chat.completions.create(model="", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Say more."}]
    time.sleep(0.1)  # a client that asks again at once: the summary is not made yet
    second = client.chat.completions.create(model="", messages=messages)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and second.model_extra["edgevlm"]["clip_encodes"] == 0
    # It ran beside the live photo, and waited neither for the summary nor in the queue.
    shown, now = first.model_extra["edgevlm"], second.model_extra["edgevlm"]
    assert shown["kv"]["images"] == shown["visual_tokens"] == now["kv"]["images"] and shown["summaries"] == []
    assert now["summary_wait_s"] == 0 and now["queue_s"] < 1
    assert now["ttft_s"] >= 0 and now["prefill_tokens"] < second.usage.prompt_tokens - cached + 8
    _checked(server[1])  # the slot's idle time made the summary
    messages += [{"role": "assistant", "content": second.choices[0].message.content},
                 {"role": "user", "content": "And?"}]
    third = client.chat.completions.create(model="", messages=messages).model_extra["edgevlm"]
    # What the page shows: the first image's summary, and the cache split by what holds it.
    assert third["kv"]["images"] == 0 and third["kv"]["summaries"] > 0 and third["kv"]["n_ctx"] == 2048
    assert third["summary_wait_s"] == 0 and third["clip_encodes"] == 0
    summaries = server[1].summaries
    assert summaries is not None and [s["turn"] for s in third["summaries"]] == [1]
    assert third["summaries"][0]["summary"] == summaries.get(third["summaries"][0]["sha256"])
    _checked(server[1])


def test_a_new_conversation_about_a_photo_seen_before_starts_from_its_prefix(
        client: OpenAI, server: tuple[str, ServerState], loaded: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = client.chat.completions.create(model="", messages=[image_message("What is this?", seed=41)])
    _checked(server[1])
    again = client.chat.completions.create(model="", messages=[image_message("Any text?", seed=41)])
    _checked(server[1])
    shown, now = first.model_extra["edgevlm"], again.model_extra["edgevlm"]
    assert (shown["prefix_cache"], now["prefix_cache"]) == ("none", "ram")
    assert again.usage.prompt_tokens_details.cached_tokens > shown["visual_tokens"] > 0
    assert now["prefill_tokens"] < 60 and now["clip_encodes"] == 0  # the question alone, no image block
    # A restarted server has an empty RAM tier and the same disk tier.
    conversation = server[1].scheduler.session.conversation
    assert conversation.prefix_cache is not None
    conversation.prefix_cache.flush()
    monkeypatch.setenv("XDG_CACHE_HOME", str(conversation.prefix_cache.folder.parent.parent))
    conversation.prefix_cache = loaded.prefix_cache()
    later = client.chat.completions.create(model="", messages=[image_message("Colours?", seed=41)])
    _checked(server[1])
    assert later.model_extra["edgevlm"]["prefix_cache"] == "disk"
    assert later.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens_details.cached_tokens


@pytest.mark.slow
def test_six_turns_resent_in_full_stay_flat(client: OpenAI, server: tuple[str, ServerState]) -> None:
    messages: list[dict[str, object]] = []
    turns = []
    for turn in range(6):
        messages.append(image_message(f"Photo {turn + 1}: what is new?", seed=100 + turn))
        reply = client.chat.completions.create(model="", messages=messages)
        numbers = reply.model_extra["edgevlm"]
        turns.append(numbers)
        # Only this message's image is live, and only its views went through CLIP.
        assert numbers["visual_tokens_live"] == numbers["visual_tokens"]
        assert numbers["clip_encodes"] == 1 + numbers["n_tiles"]
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        _checked(server[1])
    prefill = [t["prefill_tokens"] for t in turns]
    assert max(prefill[2:]) <= 1.5 * prefill[1], prefill
    conversation = server[1].scheduler.session.conversation
    assert conversation.visual_tokens_live == 0  # every answered image is a summary now
    assert len(conversation.records) == 6


def test_a_history_longer_than_the_context_is_cut_before_any_work(client: OpenAI,
                                                                   server: tuple[str, ServerState]) -> None:
    """Issue 39.6: 100 resent turn pairs were decoded whole on a miss (322k prefill tokens on the
    Qwen pair), then dropped, and dropped_turns said 0."""
    history: list[dict[str, object]] = []
    for i in range(100):
        history += [{"role": "user", "content": f"Tell me about item {i}, please, with details."},
                    {"role": "assistant", "content": f"Item {i} is a small thing with a long story to it."}]
    ask = [*history, {"role": "user", "content": "Go on."}]
    first = client.chat.completions.create(model="", messages=ask)
    shown = first.model_extra["edgevlm"]
    n_ctx = server[1].scheduler.session.conversation.sequence.n_ctx
    assert shown["dropped_turns"] > 50 and shown["prefill_tokens"] <= n_ctx
    _checked(server[1])
    history += [{"role": "user", "content": "Go on."},
                {"role": "assistant", "content": first.choices[0].message.content}]
    ask = [*history, {"role": "user", "content": "More."}]
    follow = client.chat.completions.create(model="", messages=ask)
    again = follow.model_extra["edgevlm"]
    assert again["prefill_tokens"] < 60  # the cut history was kept: a follow-up hits it
    assert again["dropped_turns"] == shown["dropped_turns"]
    _checked(server[1])


def test_an_image_met_only_in_history_is_summarised_once(client: OpenAI,
                                                         server: tuple[str, ServerState]) -> None:
    history = [image_message("What is this?", seed=4),
               {"role": "assistant", "content": "Something I said elsewhere."},
               {"role": "user", "content": "And what colour was it?"}]
    first = client.chat.completions.create(model="", messages=history)
    assert first.model_extra["edgevlm"]["clip_encodes"] >= 1  # summarised now, while shown
    _checked(server[1])
    history[2] = {"role": "user", "content": "What else?"}
    again = client.chat.completions.create(model="", messages=history)
    assert again.model_extra["edgevlm"]["clip_encodes"] == 0
    assert again.model_extra["edgevlm"]["visual_tokens_live"] == 0


def test_ollama_chat_with_an_image(server: tuple[str, ServerState]) -> None:
    client = ollama.Client(host=server[0], timeout=120)
    assert client.list().models[0].model == f"{server[1].model.id}:latest"
    assert "vision" in client.show(server[1].model.id).capabilities
    messages = [{"role": "user", "content": "What is this?", "images": [photo_bytes(5, fmt="JPEG")]}]
    whole = client.chat(model=server[1].model.id, messages=messages, options={"temperature": 0})
    assert whole.done and whole.message.content and whole.eval_count > 0
    parts = list(client.chat(model=server[1].model.id, messages=messages, stream=True,
                             options={"temperature": 0}))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts).strip() == whole.message.content
    generated = client.generate(model=server[1].model.id, prompt="Say hi.", options={"num_predict": 4})
    assert generated.done and generated.eval_count <= 4
    _checked(server[1])


def _image_body(url: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}


@pytest.mark.parametrize(("body", "status", "code"), [
    (_image_body("data:image/png;base64,@@@"), 400, "invalid_base64"),
    (_image_body("data:image/png;base64,aGVsbG8="), 400, "invalid_image"),
    (_image_body("https://example.com/a.png"), 400, "remote_url_refused"),
    (_image_body("file:///etc/hostname"), 400, "file_url_refused"),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "frob"}}}}, 400, "invalid_schema"),
    ({"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "context_length_exceeded"),
    ({"messages": [{"role": "tool", "content": "x"}], "stream": True}, 400, "invalid_request"),
    ({"messages": "hello"}, 400, "invalid_request"),
    ({"messages": [{"role": "user", "content": "hi"}], "edgevlm": {"pool": 3}}, 400, "invalid_request"),
    ({"messages": [{"role": "user", "content": "hi"}], "edgevlm": "pool"}, 400, "invalid_request"),
])
def test_bad_requests_get_openai_errors(server: tuple[str, ServerState], body: dict, status: int,
                                        code: str | None) -> None:
    reply = httpx.post(f"{server[0]}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["message"] and "Traceback" not in error["message"] and error["code"] == code


_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/responses", {"input": []}, "input"),
    ("/v1/completions", {"prompt": ["one", "two"]}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stop": 5}, "stop"),
    ("/v1/chat/completions", {"messages": _HI, "seed": 2**64}, "seed"),
    ("/v1/chat/completions", {"messages": _HI, "stop": ["."] * 9}, "stop"),
    ("/v1/chat/completions", {"messages": _HI, "edgevlm": {"merge": "0.5:frob"}}, "edgevlm.merge"),
    ("/v1/chat/completions", {"messages": _HI, "edgevlm": {"detail": "frob"}}, "edgevlm.detail"),
    ("/api/chat", {"model": "", "messages": _HI, "options": {"num_predict": 0}}, "options.num_predict"),
    ("/api/generate", {"model": "", "prompt": "hi", "options": {"pool": 3}}, "options.pool"),
    ("/api/generate", {"model": "", "prompt": "hi", "options": {"temperature": "hot"}},
     "options.temperature"),
])
def test_each_route_refuses_what_its_request_model_forbids_by_name(
        server: tuple[str, ServerState], path: str, body: dict, param: str) -> None:
    """Bodies are parsed by the models /openapi.json publishes (issue 50): a field they forbid is
    a 400 naming it, in the route's API's shape, never a 500."""
    reply = httpx.post(f"{server[0]}{path}", json=body, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    if path.startswith("/api/"):  # Ollama's shape: the message names the field
        assert isinstance(error, str) and error.startswith(f"{param}: ")
    else:
        assert error["param"] == param and "Traceback" not in error["message"]


def test_limits_keys_and_pixels(server: tuple[str, ServerState], monkeypatch: pytest.MonkeyPatch) -> None:
    url, state = server
    body = {"messages": [image_message("hi", seed=6)]}
    monkeypatch.setattr(state, "max_body_bytes", 1000)
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 413
    monkeypatch.setattr(state, "max_body_bytes", 50 << 20)
    monkeypatch.setattr(state, "api_key", "sesame")
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 401
    wrong = httpx.post(f"{url}/api/chat", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and isinstance(wrong.json()["error"], str)  # Ollama's shape
    monkeypatch.setattr(state, "api_key", None)
    monkeypatch.setenv("EDGEVLM_MAX_PIXELS", "1000")
    reply = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert reply.status_code == 400 and "pixels" in reply.json()["error"]["message"]
    monkeypatch.delenv("EDGEVLM_MAX_PIXELS")
    bad = httpx.post(f"{url}/api/chat", json={"model": "", "messages": [
        {"role": "user", "content": "x", "images": ["%%%"]}]})
    assert bad.status_code == 400 and "messages[0].images[0]" in bad.json()["error"]
    ok = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)  # still serving
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


def test_files_inside_the_media_folder_only(server: tuple[str, ServerState], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    url, state = server
    media = tmp_path / "media"
    media.mkdir()
    (media / "a.png").write_bytes(photo_bytes(7))
    (tmp_path / "secret.png").write_bytes(photo_bytes(8))
    monkeypatch.setattr(state, "media_dir", media.resolve())

    def ask(path: Path) -> httpx.Response:
        part = {"type": "image_url", "image_url": {"url": path.as_uri()}}
        return httpx.post(f"{url}/v1/chat/completions", timeout=120,
                          json={"messages": [{"role": "user", "content": [part]}]})

    assert ask(media / "a.png").status_code == 200
    assert ask(media / ".." / "secret.png").json()["error"]["code"] == "file_url_refused"
    # Issue 39.9: these were 500s, or read a huge file whole, or echoed a 1 MB URL back.
    def ask_url(image_url: str) -> httpx.Response:
        part = {"type": "image_url", "image_url": {"url": image_url}}
        return httpx.post(f"{url}/v1/chat/completions", timeout=120,
                          json={"messages": [{"role": "user", "content": [part]}]})

    nul = ask_url(f"file://{media}/a%00.png")
    assert nul.status_code == 400 and nul.json()["error"]["code"] == "file_url_refused"
    big = media / "big.png"
    with big.open("wb") as handle:
        handle.truncate(state.max_body_bytes + 1)  # sparse: no disk spent
    assert ask(big).status_code == 413 and ask(big).json()["error"]["code"] == "file_too_large"
    long = ask_url("x" * 1_000_000)
    assert long.status_code == 400 and len(long.text) < 2000 and long.json()["error"]["code"]
    _checked(state)


def test_a_full_queue_answers_503(server: tuple[str, ServerState], monkeypatch: pytest.MonkeyPatch) -> None:
    url, state = server
    monkeypatch.setattr(state.scheduler, "max_queue", 1)
    monkeypatch.setattr(state, "chat", dataclasses.replace(state.chat, max_tokens=200))
    sequence = state.scheduler.session.conversation.sequence
    monkeypatch.setattr(sequence, "step_s", 0.02)  # the running answer outlasts the other two requests
    sequence.script(" ".join(str(n) for n in range(1, 101)), " ".join(str(n) for n in range(1, 101)))
    body = {"messages": [{"role": "user", "content": "Count to one hundred."}], "max_tokens": 200}
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=120)
        waiting = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if waiting is None and state.scheduler.running:
                waiting = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=120)
            if state.scheduler.waiting == 1:
                break
            time.sleep(0.01)
        refused = httpx.post(f"{url}/v1/chat/completions", json=body)
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert refused.json()["error"]["code"] == "queue_full"
        assert running.result().status_code == 200 and waiting.result().status_code == 200
    _checked(state)


def test_a_client_that_leaves_mid_stream_frees_the_worker(client: OpenAI, server: tuple[str, ServerState],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    state = server[1]
    monkeypatch.setattr(state, "chat", dataclasses.replace(state.chat, max_tokens=400))
    stream = client.chat.completions.create(
        model="", stream=True, max_tokens=400,
        messages=[{"role": "user", "content": "Count from 1 to 500, one number per line."}])
    for seen, _ in enumerate(stream):
        if seen == 3:
            break
    stream.close()
    _checked(state)
    last = state.scheduler.session.conversation.records[-1]
    assert last.interrupted and last.stats["completion_tokens"] < 400
    after = client.chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}])
    assert after.choices[0].finish_reason in ("stop", "length")


def test_eight_clients_at_once_get_their_own_answers(client: OpenAI, server: tuple[str, ServerState]) -> None:
    requests = [[{"role": "user", "content": f"Name a thing number {i}."}] if i % 2 else
                [image_message(f"Photo {i}?", seed=200 + i, detail="low")] for i in range(8)]

    def ask(messages: list[dict[str, object]]) -> str:
        reply = client.chat.completions.create(model="", messages=messages, temperature=0)
        return reply.choices[0].message.content

    alone = [ask(m) for m in requests]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, requests))
    assert together == alone
    assert len(set(alone)) > 1  # the answers differ, so a mix-up would show
    _checked(server[1])


def test_a_queued_request_reports_its_wait_apart_from_its_ttft(
        client: OpenAI, server: tuple[str, ServerState], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39.16: ttft_s counted the wait for a slot; queue_s + ttft_s + decode is the request."""
    monkeypatch.setattr(server[1].scheduler.session.conversation.sequence, "prefill_token_s", 1e-3)
    long = [image_message("Count slowly. " + "one two three " * 60, seed=901, detail="low")]  # long prefill
    short = [{"role": "user", "content": "Hi."}]

    def ask(messages: list[dict[str, object]], max_tokens: int) -> tuple[dict[str, float], float]:
        began = time.perf_counter()
        reply = client.chat.completions.create(model="", messages=messages, max_tokens=max_tokens,
                                               temperature=0)
        return reply.model_extra["edgevlm"], time.perf_counter() - began

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, long, MAX_TOKENS)
        deadline = time.monotonic() + 30
        while not server[1].scheduler.running and time.monotonic() < deadline:  # the long turn has the slot
            time.sleep(0.005)
        (waited, wall_s), _ = pool.submit(ask, short, 2).result(), first.result()
    assert waited["queue_s"] > 0.1
    assert waited["ttft_s"] < waited["queue_s"]  # its own prefill, not the other's answer
    assert waited["queue_s"] + waited["ttft_s"] <= wall_s
    _checked(server[1])


# -- requests that once answered 500, and other edges of the API ------------------------------

def _deep(depth: int) -> str:
    return '{"messages": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", '{"messages": [{"role": {}, "content": "a"}]}'),
    ("/api/chat", '{"messages": [{"role": {}, "content": "a"}]}'),
    ("/v1/chat/completions", _deep(100_000)),
    ("/api/chat", _deep(100_000)),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud800"}]}'),
    ("/api/chat", '{"messages": [{"role": "user", "content": "hi \\ud800"}]}'),
    ("/api/generate", '{"prompt": "hi \\udfff"}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "logprobs": true}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "n": 2}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}'),
    ("/v1/chat/completions", '{"messages": [{"role": "tool", "tool_call_id": {}, "content": "x"}]}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "response_format": '
                             '{"type": "json_schema", "json_schema": {"schema": {"$defs": {"Node": {"type": '
                             '"object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}, '
                             '"$ref": "#/$defs/Node"}}}}'),
])
def test_odd_requests_get_a_400_in_the_apis_shape(server: tuple[str, ServerState], path: str,
                                                  body: str) -> None:
    reply = httpx.post(f"{server[0]}{path}", content=body.encode(), timeout=60,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    message = error if path.startswith("/api/") else error["message"]
    assert message and "Traceback" not in message and "internal" not in message
    if "$ref" in body:
        assert "recursive $ref" in message
    if "logprobs" in body:
        assert error["param"] == "logprobs"
    assert httpx.get(f"{server[0]}/health").status_code == 200  # still serving


def test_a_non_streamed_request_whose_client_hangs_up_is_cancelled(server: tuple[str, ServerState],
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """…and is logged as a 499, not as `200 … completion=0` (issue 49.8)."""
    import logging

    caplog.set_level(logging.INFO, logger="edgevlm.server")
    url, state = server
    monkeypatch.setattr(state, "chat", dataclasses.replace(state.chat, max_tokens=300))
    sequence = state.scheduler.session.conversation.sequence
    monkeypatch.setattr(sequence, "step_s", 0.01)  # 300 tokens: 3 s, past the client's 1 s
    for path in ("/v1/chat/completions", "/api/chat"):
        sequence.script("Once upon a time " * 40)
        body = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
                "max_tokens": 300, "temperature": 0, "options": {"num_predict": 300, "temperature": 0},
                "stream": False}  # greedy and long: it outlasts the hang-up (a sampled one may stop early)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}{path}", json=body, timeout=httpx.Timeout(60, read=1.0))
        _checked(state)
        last = state.scheduler.session.conversation.records[-1]
        made = last.stats["completion_tokens"]
        assert last.interrupted and made < 300, (path, made)
        deadline, logged = time.monotonic() + 10, []
        while not logged and time.monotonic() < deadline:
            time.sleep(0.05)
            logged = [r.getMessage() for r in caplog.records if f"POST {path} " in r.getMessage()]
        assert logged and f"POST {path} 499 " in logged[-1], logged
    monkeypatch.setattr(state, "chat", dataclasses.replace(state.chat, max_tokens=MAX_TOKENS))
    monkeypatch.setattr(sequence, "step_s", 0.0)
    sequence.script("Once upon a time " * 40)
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={**body, "max_tokens": 1 << 20})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == MAX_TOKENS  # the cap


def test_a_request_with_many_earlier_images_stops_when_its_client_leaves(
        server: tuple[str, ServerState]) -> None:
    """Issue 39.7: summarising a history's images sent no event and watched no disconnect, so
    a request with 200 earlier images ran on for 705 s after its client gave up."""
    url, state = server
    seeds = range(700, 712)
    history: list[dict[str, object]] = []
    for seed in seeds:  # images never seen: each is summarised (CLIP and a caption) first
        history += [image_message(f"Photo {seed}?", seed=seed), {"role": "assistant", "content": "A photo."}]
    body = {"messages": [*history, {"role": "user", "content": "Which was best?"}], "stream": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    _checked(state)  # the worker is free again, and the cache is whole
    store = state.scheduler.session.summaries
    summarised = sum(store.get(hashlib.sha256(photo_bytes(seed)).hexdigest()) is not None for seed in seeds)
    assert summarised < len(seeds)  # it stopped part-way, not after all of them
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "Hi"}]})
    assert reply.status_code == 200


def test_headers_that_never_finish_get_a_408(server: tuple[str, ServerState],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39.9: uvicorn held such a connection for ever, with no answer."""
    from edgevlm.server import app

    monkeypatch.setattr(app, "HEADERS_TIMEOUT_S", 1.0)
    host, port = server[0].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.5)
        sock.sendall(b"X-Slow: 1\r\n")  # a byte now and then used to keep it open
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
    assert httpx.get(f"{server[0]}/v1/models", timeout=30).status_code == 200  # others still served


def test_a_body_that_stalls_gets_a_408(server: tuple[str, ServerState],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from edgevlm.server import http

    monkeypatch.setattr(http, "BODY_READ_TIMEOUT_S", 1.0)
    host, port = server[0].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"messages\"")
        answer = b""
        while b"body_timeout" not in answer and (chunk := sock.recv(4096)):
            answer += chunk  # the head and the body may come in separate packets
    assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout" in answer


def test_the_missing_pieces_clients_call(server: tuple[str, ServerState]) -> None:
    url, state = server
    model = httpx.get(f"{url}/v1/models/{state.model.id}").json()
    assert model["id"] == state.model.id and model["object"] == "model"
    missing = httpx.get(f"{url}/v1/models/gpt-4o")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    running = httpx.get(f"{url}/api/ps").json()["models"]
    assert running[0]["name"] == f"{state.model.id}:latest" and running[0]["context_length"] == 2048
    embed = httpx.post(f"{url}/api/embed", json={"model": state.model.id, "input": "hi"})
    assert embed.status_code == 400 and "does not support embeddings" in embed.json()["error"]
    for path in ("/api/generate", "/api/chat"):
        body = {"model": state.model.id}
        assert httpx.post(f"{url}{path}", json=body).json()["done_reason"] == "load"
        assert httpx.post(f"{url}{path}", json={**body, "keep_alive": 0}).json()["done_reason"] == "unload"
    wrong_method = httpx.get(f"{url}/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert httpx.get(f"{url}/favicon.ico").status_code == 200


def test_openapi_declares_the_request_bodies(server: tuple[str, ServerState]) -> None:
    schema = httpx.get(f"{server[0]}/openapi.json").json()
    ids = [op["operationId"] for path in schema["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))  # no duplicate operation ids
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    assert {"messages", "tools", "tool_choice", "response_format"} <= set(body["properties"])
    assert "400" in chat["responses"] and "/api/generate" in schema["paths"]


def test_a_symlink_out_of_the_media_folder_does_not_reveal_its_target(
        server: tuple[str, ServerState], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, state = server
    media, secret = tmp_path / "media", tmp_path / "hidden-place" / "secret.png"
    media.mkdir()
    secret.parent.mkdir()
    secret.write_bytes(photo_bytes(12))
    (media / "link.png").symlink_to(secret)
    monkeypatch.setattr(state, "media_dir", media.resolve())
    part = {"type": "image_url", "image_url": {"url": (media / "link.png").as_uri()}}
    reply = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": [part]}]})
    assert reply.status_code == 400 and "hidden-place" not in reply.text and "link.png" in reply.text


def test_a_request_chooses_its_images_budget_by_task(client: OpenAI, server: tuple[str, ServerState]) -> None:
    """Issue 38: OpenAI's detail (low: a caption's few tokens, high: the most the family reads) and
    edgevlm's own `detail` (caption, chat, ocr, grounding, video-frame); a bad one is a 400."""
    low = client.chat.completions.create(model="", messages=[image_message("What?", seed=61, detail="low")])
    high = client.chat.completions.create(model="", messages=[image_message("What?", seed=61, detail="high")])
    assert low.model_extra["edgevlm"]["n_tiles"] == 0 and low.model_extra["edgevlm"]["visual_tokens"] == 64
    assert high.model_extra["edgevlm"]["n_tiles"] > 0 and high.model_extra["edgevlm"]["pool"] == 1
    caption = client.chat.completions.create(model="", messages=[image_message("What?", seed=61)],
                                             extra_body={"edgevlm": {"detail": "caption"}})
    assert caption.model_extra["edgevlm"]["visual_tokens"] == 64
    bad = httpx.post(f"{server[0]}/v1/chat/completions", json={
        "messages": [image_message("What?", seed=61)], "edgevlm": {"detail": "everything"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "edgevlm.detail"
    _checked(server[1])


def test_find_is_refused_on_a_family_that_writes_no_boxes(server: tuple[str, ServerState]) -> None:
    reply = httpx.post(f"{server[0]}/v1/chat/completions", json={
        "messages": [image_message("Where?", seed=62)], "edgevlm": {"find": "a cat"}})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "edgevlm.find" and error["code"] == "grounding_unsupported"
