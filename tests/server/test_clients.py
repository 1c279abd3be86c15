"""The client libraries people point at a local server, each against a real `edgevlm serve`:
openai, ollama, langchain-openai, langchain-ollama, instructor, litellm and simonw's llm.

For every client: a text turn, an image turn, a stream, structured output parsed strictly into
a pydantic model, and a tool call whose result is sent back. The test models' words mean
nothing; the shapes, the grammar and the round trips are real.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from edgevlm.chat.settings import ChatSettings
from edgevlm.server.launch import ServeSettings, build_state
from edgevlm.server.turns import ServerState

from ..conftest import ROOT
from .test_app import data_url, image_message, images_content, photo_bytes, serving

MAX_TOKENS = 96  # enough for a tool call or a small JSON object, and the server's cap


class Photo(BaseModel):
    """What the structured-output requests ask for: bounded, so the grammar ends it in time."""

    colour: Literal["red", "green", "blue"]
    count: int
    caption: str = Field(max_length=24)


class Weather(BaseModel):
    """get_weather's parameters."""

    city: Literal["Paris", "Rome", "Oslo"]
    days: int


class Review(BaseModel):
    """What real pydantic models hold (issue 39.5/8): a long text bound, ge/le, emoji literals."""

    mood: Literal["😀 happy", "😢 sad"]
    stars: int = Field(ge=1, le=5)
    note: str = Field(max_length=24)
    essay: list[str] = Field(max_length=2000)


class Bounded(BaseModel):
    """pydantic's bounds as openai's .parse sends them (issue 49.5): one-sided and two-sided, on
    int and float, of either sign."""

    count: int = Field(ge=0)
    share: float = Field(ge=0, le=1)
    offset: float = Field(gt=-2.5, lt=7.25)
    debt: int = Field(le=-3)
    weight: float = Field(gt=0)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The forecast for a city.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                   "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "days": {"type": "integer"}}}}}


# With `auto` (all that Ollama's API and llm offer), this prompt makes the tiny test model call
# the tool under greedy decoding; what it writes then is held to the tool's schema by the grammar.
CALLING_SYSTEM = "You are a JSON API. Every reply is a JSON object."
CALLING_QUESTION = "Reply with JSON: weather in Oslo."


def get_weather(city: str, days: int) -> str:
    """The forecast for a city."""
    return f"sunny in {city} for {days} days"


@pytest.fixture(scope="module")
def server(test_models: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerState]]:
    from edgevlm.runtime.loading import ModelFlags, load

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("clients-cache")))
        loaded = load(ModelFlags(model=str(test_models["text"]), mmproj=str(test_models["mmproj_112"]),
                                 n_ctx=2048, n_gpu_layers=0, answer_tokens=MAX_TOKENS))
        # The clients' shapes are the point here: each image at its global view (64 tokens) and
        # summarised from its answer; tiles and captions are test_app.py's.
        chat = ChatSettings(max_tokens=MAX_TOKENS, max_tiles=0, summary="answer", pool=None)
        state = build_state(loaded, ServeSettings(chat=chat, max_queue=8, cache=True))
        with serving(state) as url:
            yield url, state
        loaded.engine.close()


@pytest.fixture(scope="module")
def photo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("photos") / "photo.jpg"
    path.write_bytes(photo_bytes(31, fmt="JPEG"))
    return path


def _strict(text: str) -> dict[str, object]:
    """JSON as a strict parser reads it (no raw control characters in strings)."""
    return json.loads(text, strict=True)


def _image_content(text: str) -> list[dict[str, object]]:
    return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_url(32)}}]


# -- openai ----------------------------------------------------------------------------------

def test_openai_parse_with_real_pydantic_bounds(server: tuple[str, ServerState]) -> None:
    import resource

    from openai import OpenAI

    client = OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    parsed = client.chat.completions.parse(model="", messages=[{"role": "user", "content": "Review it."}],
                                           response_format=Review, temperature=0)
    review = parsed.choices[0].message.parsed
    assert isinstance(review, Review) and review.mood in ("😀 happy", "😢 sad") and 1 <= review.stars <= 5
    assert "\ufffd" not in parsed.choices[0].message.content
    # A bound of 10^9 items is a small grammar too (it hung and grew to 23 GB), the server in-process.
    huge = {"type": "json_schema", "json_schema": {"name": "huge", "schema": {
        "type": "array", "items": {"type": "string", "maxLength": 10**9}, "maxItems": 10**9}}}
    reply = client.chat.completions.create(model="", messages=[{"role": "user", "content": "List."}],
                                           response_format=huge, max_tokens=8)
    assert reply.choices[0].message.content is not None
    grown_bytes = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) * 1024
    assert grown_bytes < 2**30



def test_openai_parse_holds_number_bounds_of_every_side(server: tuple[str, ServerState]) -> None:
    """`minimum: 0` alone gave -9999999999999999 in 3 answers of 6, and float bounds failed .parse
    on every family: the grammar now holds each bound, so every answer parses; one that could not
    would be a 422 in OpenAI's shape, never a silently invalid success."""
    import openai
    from openai import OpenAI

    client = OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    for seed in range(4):
        try:
            parsed = client.chat.completions.parse(
                model="", messages=[{"role": "user", "content": "Numbers, please."}], response_format=Bounded,
                temperature=1.0, seed=seed)
        except openai.UnprocessableEntityError as exc:  # reported as failing, in OpenAI's shape
            assert exc.body["code"] == "answer_mismatch"
            continue
        value = parsed.choices[0].message.parsed
        assert isinstance(value, Bounded), parsed.choices[0].message.content
        assert value.count >= 0 and 0 <= value.share <= 1 and -2.5 < value.offset < 7.25
        assert value.debt <= -3 and value.weight > 0


def test_openai(server: tuple[str, ServerState]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    text = client.chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}])
    assert text.choices[0].message.content
    image = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": _image_content("What?")}])
    assert image.model_extra["edgevlm"]["visual_tokens"] > 0
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Hi"}], stream=True) if c.choices)
    assert streamed == text.choices[0].message.content  # the same answer, trimmed the same way
    parsed = client.chat.completions.parse(model="", messages=[{"role": "user", "content": "Describe."}],
                                           response_format=Photo)
    assert isinstance(parsed.choices[0].message.parsed, Photo)
    _strict(parsed.choices[0].message.content)
    messages: list[dict[str, object]] = [{"role": "user", "content": "Weather in Rome?"}]
    called = client.chat.completions.create(model="", messages=messages, tools=[WEATHER_TOOL],
                                            tool_choice="required")
    assert called.choices[0].finish_reason == "tool_calls"
    call = called.choices[0].message.tool_calls[0]
    args = Weather.model_validate(_strict(call.function.arguments))
    messages += [called.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": get_weather(args.city, args.days)}]
    after = client.chat.completions.create(model="", messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="none")
    assert after.choices[0].message.content and after.usage.prompt_tokens_details.cached_tokens > 0


def test_two_images_in_one_message_on_the_llava_pair(server: tuple[str, ServerState]) -> None:
    """The openai and ollama clients send two photos in one message: LLaVA sees them labelled
    "Image 1:" and "Image 2:", each with its own view, and answers."""
    import ollama
    from openai import OpenAI

    client = OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    content = images_content("What changed?", 33, 34)
    answer = client.chat.completions.create(model="", messages=[{"role": "user", "content": content}])
    extra = answer.model_extra["edgevlm"]
    assert answer.choices[0].message.content and len(extra["image_tokens"]) == 2
    assert min(extra["image_tokens"]) >= 64 and sum(extra["image_tokens"]) == extra["visual_tokens"]
    reply = ollama.Client(host=server[0], timeout=120).chat(model=server[1].model.id, messages=[
        {"role": "user", "content": "Compare.", "images": [photo_bytes(35), photo_bytes(36)]}])
    assert reply.done and reply.message.content and reply.prompt_eval_count > 128


def test_openai_streams_a_named_tool_call(server: tuple[str, ServerState]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    chunks = list(client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Oslo?"}], tools=[WEATHER_TOOL], stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    Weather.model_validate(_strict(calls[0].function.arguments))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)  # the call is not text


# -- ollama ----------------------------------------------------------------------------------

def test_ollama(server: tuple[str, ServerState]) -> None:
    import ollama

    client, name = ollama.Client(host=server[0], timeout=120), server[1].model.id
    text = client.chat(model=name, messages=[{"role": "user", "content": "Hi"}])
    assert text.message.content
    image = client.chat(model=name,
                        messages=[{"role": "user", "content": "What?", "images": [photo_bytes(33)]}])
    assert image.done and image.prompt_eval_count > 64  # the image's 64 tokens and the question
    parts = list(client.chat(model=name, messages=[{"role": "user", "content": "Hi"}], stream=True))
    assert "".join(p.message.content for p in parts) == text.message.content
    shaped = client.chat(model=name, messages=[{"role": "user", "content": "Describe."}],
                         format=Photo.model_json_schema())
    Photo.model_validate(_strict(shaped.message.content))
    messages: list[object] = [{"role": "system", "content": CALLING_SYSTEM},
                              {"role": "user", "content": CALLING_QUESTION}]
    called = client.chat(model=name, messages=messages, tools=[WEATHER_TOOL], options={"temperature": 0})
    call = called.message.tool_calls[0]
    assert call.function.name == "get_weather" and not called.message.content
    Weather.model_validate(call.function.arguments)
    messages += [called.message, {"role": "tool", "tool_name": "get_weather", "content": "sunny"}]
    after = client.chat(model=name, messages=messages)
    assert after.done and after.message.content and after.prompt_eval_count > 0


# -- langchain -------------------------------------------------------------------------------

def _langchain_round(chat: object, image: dict[str, object], *, forced: bool) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

    assert chat.invoke("Hi").content
    assert chat.invoke([HumanMessage(content=[{"type": "text", "text": "What?"}, image])]).content
    assert "".join(c.content for c in chat.stream("Hi"))
    photo = chat.with_structured_output(Photo, method="json_schema").invoke("Describe.")
    assert isinstance(photo, Photo)
    # Ollama's API has no tool_choice: there the question itself leads to the call.
    bound = chat.bind_tools([WEATHER_TOOL], **({"tool_choice": "get_weather"} if forced else {}))
    question = [SystemMessage(content=CALLING_SYSTEM), HumanMessage(content=CALLING_QUESTION)]
    called = bound.invoke(question)
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    Weather.model_validate(called.tool_calls[0]["args"])
    result = ToolMessage(content="sunny", tool_call_id=called.tool_calls[0]["id"])
    after = chat.invoke([*question, called, result])
    assert after.content


def test_langchain_openai(server: tuple[str, ServerState]) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=f"{server[0]}/v1", api_key="unused", model=server[1].model.id, temperature=0,
                      max_retries=0, timeout=120)
    _langchain_round(chat, {"type": "image_url", "image_url": {"url": data_url(34)}}, forced=True)
    via_tools = chat.with_structured_output(Photo, method="function_calling").invoke("Describe.")
    assert isinstance(via_tools, Photo)


def test_langchain_ollama(server: tuple[str, ServerState]) -> None:
    from langchain_ollama import ChatOllama

    chat = ChatOllama(base_url=server[0], model=server[1].model.id, temperature=0)
    _langchain_round(chat, {"type": "image_url", "image_url": {"url": data_url(35)}}, forced=False)


# -- instructor ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor(server: tuple[str, ServerState], mode: str) -> None:
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0),
                                    mode=getattr(instructor.Mode, mode))
    photo = client.chat.completions.create(model=server[1].model.id, response_model=Photo, max_retries=0,
                                           messages=[{"role": "user",
                                                      "content": _image_content("Describe.")}])
    assert isinstance(photo, Photo)


# -- litellm ---------------------------------------------------------------------------------

def test_litellm(server: tuple[str, ServerState]) -> None:
    import litellm

    common = {"model": f"openai/{server[1].model.id}", "api_base": f"{server[0]}/v1", "api_key": "unused",
              "timeout": 120}
    text = litellm.completion(messages=[{"role": "user", "content": "Hi"}], **common)
    assert text.choices[0].message.content
    image = litellm.completion(messages=[{"role": "user", "content": _image_content("What?")}], **common)
    assert image.usage.prompt_tokens > 64
    streamed = "".join(c.choices[0].delta.content or "" for c in litellm.completion(
        messages=[{"role": "user", "content": "Hi"}], stream=True, **common))
    assert streamed == text.choices[0].message.content
    shaped = litellm.completion(messages=[{"role": "user", "content": "Describe."}], response_format=Photo,
                                **common)
    Photo.model_validate(_strict(shaped.choices[0].message.content))
    messages: list[object] = [{"role": "user", "content": "Weather in Rome?"}]
    called = litellm.completion(messages=messages, tools=[WEATHER_TOOL], tool_choice="required", **common)
    call = called.choices[0].message.tool_calls[0]
    Weather.model_validate(_strict(call.function.arguments))
    messages += [called.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    after = litellm.completion(messages=messages, **common)
    assert after.choices[0].message.content


# -- llm -------------------------------------------------------------------------------------

@pytest.fixture()
def llm_model(server: tuple[str, ServerState], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """llm's own way to reach an OpenAI-compatible server: extra-openai-models.yaml."""
    import llm

    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path))
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: edgevlm\n  model_name: {server[1].model.id}\n  api_base: {server[0]}/v1\n"
        "  vision: true\n  supports_schema: true\n  supports_tools: true\n")
    return llm.get_model("edgevlm")


def test_llm(llm_model: object, photo_file: Path) -> None:
    import llm

    model = llm_model
    assert model.prompt("Hi", stream=False).text()
    assert model.prompt("What?", attachments=[llm.Attachment(path=str(photo_file))]).text()
    assert "".join(model.prompt("Hi"))
    shaped = model.prompt("Describe.", schema=Photo, attachments=[llm.Attachment(path=str(photo_file))])
    Photo.model_validate(_strict(shaped.text()))
    seen: list[tuple[str, int]] = []

    def weather(city: str, days: int) -> str:
        """The forecast for a city."""
        seen.append((city, days))
        return "sunny"

    # llm cannot ask for tool_choice "required", and under "auto" whether the small model calls
    # or answers in text turns on its logits, which differ between CPU builds: two prompts give
    # it its chances (each has made the call on one of the builds tried).
    for system in (CALLING_SYSTEM, "Use tools."):
        conversation = model.conversation(tools=[weather])
        called = conversation.prompt(CALLING_QUESTION, system=system)
        if called.tool_calls():
            break
    assert [call.name for call in called.tool_calls()] == ["weather"]
    results = called.execute_tool_calls()
    assert seen and isinstance(seen[0][1], int)  # llm ran the tool with the call's arguments
    answered = conversation.prompt(tool_results=results, system=system)
    assert answered.text() or answered.tool_calls()  # the result went back and was answered


def test_response_format_beside_tools_and_a_cut_call(server: tuple[str, ServerState]) -> None:
    """Issue 39.8: pydantic-ai's NativeOutput sends response_format with tools (it was a 400);
    a call cut by max_tokens came back as a raw JSON fragment in content."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    shape = {"type": "json_schema", "json_schema": {"name": "Photo", "schema": Photo.model_json_schema()}}
    both = client.chat.completions.create(model="", messages=[{"role": "user", "content": "Describe."}],
                                          response_format=shape, tools=[WEATHER_TOOL], temperature=0)
    message = both.choices[0].message
    assert message.tool_calls or Photo.model_validate(_strict(message.content or ""))
    cut = client.chat.completions.create(model="", messages=[{"role": "user", "content": "Weather in Rome?"}],
                                         tools=[WEATHER_TOOL], tool_choice="required", max_tokens=3)
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and not choice.message.content and not choice.message.tool_calls
    streamed = list(client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER_TOOL],
        tool_choice="required", max_tokens=3, stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)


def test_openai_completions_and_responses(server: tuple[str, ServerState]) -> None:
    """Issue 39.10: /v1/completions (llama-index's OpenAILike by default) and /v1/responses."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    done = client.completions.create(model="", prompt="Say hi.", max_tokens=8, temperature=0)
    assert done.object == "text_completion" and done.choices[0].text and done.usage.completion_tokens > 0
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="", prompt="Say hi.", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed.strip() == done.choices[0].text

    text = client.responses.create(model="", input="Say hi.", max_output_tokens=8, temperature=0)
    assert text.output_text and text.usage.output_tokens > 0
    image = client.responses.create(model="", instructions="Be brief.", max_output_tokens=8, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                     {"type": "input_image", "image_url": data_url(33)}]}])
    assert image.output_text and image.model_extra["edgevlm"]["visual_tokens"] > 0
    events = list(client.responses.create(model="", input="Say hi.", max_output_tokens=8, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == text.output_text
    typed = client.responses.create(model="", input="Describe.", temperature=0, text={"format": {
        "type": "json_schema", "name": "Photo", "schema": Photo.model_json_schema()}})
    Photo.model_validate(_strict(typed.output_text))


def test_ollama_shapes_clients_read(server: tuple[str, ServerState]) -> None:
    import httpx

    version = httpx.get(f"{server[0]}/api/version").json()
    assert tuple(int(p) for p in version["version"].split(".")) >= (0, 5, 0) and version["edgevlm"]
    assert httpx.head(f"{server[0]}/api/tags").status_code == 200
    digest = httpx.get(f"{server[0]}/api/tags").json()["models"][0]["digest"]
    assert len(digest) == 64 and digest == httpx.get(f"{server[0]}/api/tags").json()["models"][0]["digest"]


def test_ollama_generate_context_continues(server: tuple[str, ServerState]) -> None:
    """Issue 39.10: /api/generate's `context` (the ollama client's way to continue a prompt)."""
    import httpx
    import ollama

    client, name = ollama.Client(host=server[0], timeout=120), server[1].model.id
    greedy = {"num_predict": 6, "temperature": 0}
    first = client.generate(model=name, prompt="Name a colour.", options=greedy)
    assert first.context
    again = client.generate(model=name, prompt="And another?", context=first.context, options=greedy)
    assert again.context and len(again.context) > len(first.context)
    assert again.prompt_eval_count is not None
    streamed = list(client.generate(model=name, prompt="And another?", context=first.context, stream=True,
                                    options=greedy))
    assert streamed[-1].context == again.context  # greedy: the same answer, so the same context
    bad = httpx.post(f"{server[0]}/api/generate", json={"prompt": "x", "context": [1, 2, 3], "stream": False})
    assert bad.status_code == 400 and "context" in bad.json()["error"]


def test_json_schema_output_follows_the_schema(server: tuple[str, ServerState],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)
    monkeypatch.setattr(server[1], "chat", dataclasses.replace(server[1].chat, max_tokens=48))  # the cap
    schema = {"type": "object", "additionalProperties": False, "required": ["colour", "count"],
              "properties": {"colour": {"enum": ["red", "green", "blue"]},
                             "count": {"type": "integer"}}}
    reply = client.chat.completions.create(
        model="", messages=[image_message("Describe the photo as JSON.", seed=2)], max_tokens=48,
        response_format={"type": "json_schema", "json_schema": {"name": "photo", "schema": schema}})
    data = json.loads(reply.choices[0].message.content, strict=True)
    assert set(data) == {"colour", "count"}
    assert data["colour"] in ("red", "green", "blue") and isinstance(data["count"], int)


# -- llama-index -----------------------------------------------------------------------------

LLAMA_INDEX_PYTHON = ROOT / ".venv-llama-index" / "bin" / "python"


@pytest.mark.skipif(not LLAMA_INDEX_PYTHON.exists(), reason="make test builds .venv-llama-index")
def test_llama_index_openai_like_with_its_defaults(server: tuple[str, ServerState]) -> None:
    """Issue 39.10: llama-index's OpenAILike, as its docs set it up (a completion model by default:
    /v1/completions), streamed, and as a chat model; it needs openai<3, so it runs in its own venv."""
    import subprocess

    done = subprocess.run([str(LLAMA_INDEX_PYTHON), str(Path(__file__).with_name("llama_index_client.py")),
                           server[0], server[1].model.id], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout)
    assert answers["is_chat_model"] is False  # its default: the completions route
    assert answers["complete"].strip() and answers["stream"].strip() and answers["chat"].strip()
