"""The request and response bodies as `/openapi.json` declares them: one description per body,
which documents the API, feeds the fuzzer and parses every request (`parse`). A body is first
checked against its published schema, so what the schema forbids is a 400 naming the field in
JSON's words (a fuzz run found `stream: {}`, `keep_alive: {}` and `edgevlm: false` accepted,
issue 49.9); the same model then parses it, and the routes read typed fields. Types and ranges
live here only; a route checks what no schema can say (an image number past the history, a
tool_call_id with no call, a schema no grammar can hold)."""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal, TypeVar

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgevlm.chat.settings import MAX_LOOK_MATCHES
from edgevlm.server.http import bad_request

Role = Literal["system", "developer", "user", "assistant", "tool"]
# A prompt must say something: the routes refuse one of only white space.
NonBlank = Annotated[str, Field(pattern=r"\S")]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ImageUrl(_Open):
    url: str = Field(description="a data:image/…;base64 URL, or file:// inside --media-dir")
    detail: Literal["auto", "low", "high"] | None = None


class FileData(_Open):
    file_data: str | None = Field(None, description="the PDF as a data:application/pdf;base64 URL")
    filename: str | None = None
    file_id: str | None = Field(None, description="an upload's id from POST /v1/files (any medium)")


class VideoUrl(_Open):
    url: str = Field(description="a data:video/…;base64 URL, or file:// inside --media-dir")


class InputVideo(_Open):
    data: str = Field(description="the video, base64")
    format: str | None = Field(None, description="its container: mp4, webm, mov, mkv")


class ContentPart(_Open):
    type: Literal["text", "image_url", "file", "video_url", "input_video"]
    text: str | None = None
    image_url: ImageUrl | None = None
    file: FileData | None = Field(None, description="a PDF: each page is shown as an image of the message")
    video_url: VideoUrl | None = Field(
        None, description="a video: one window's frames spread over it (8 blocks), each after its time")
    input_video: InputVideo | None = Field(None, description="llama-server's form of a video part")


class FunctionSpec(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(_Open):
    type: Literal["function"] = "function"
    function: FunctionSpec


class CalledFunction(_Open):
    name: str
    arguments: str | dict[str, Any]


class ToolCallEntry(_Open):
    id: str | None = None
    type: Literal["function"] | None = None
    function: CalledFunction


class ChatMessage(_Open):
    role: Role
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallEntry] | None = None
    tool_call_id: str | None = None


# The sampler's fields both APIs share, with their ranges (Ollama's options add their own).
Temperature = Annotated[float, Field(ge=0, le=2)]
Share = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
AnswerTokens = Annotated[int, Field(ge=1, le=1 << 20)]
Stop = str | Annotated[list[str], Field(max_length=8)]


class EdgevlmOptions(_Open):
    pool: Literal["auto", 1, 2] | None = None
    look: list[Annotated[int, Field(ge=1)]] | None = Field(None, max_length=16)
    progress: bool | None = None
    fps: float | None = Field(None, ge=0.01, le=30)
    frame_tokens: int | None = Field(None, ge=16, le=16384)
    merge: Annotated[float, Field(gt=0, le=1)] | Annotated[str, Field(max_length=80)] | None = None
    look_matches: int | None = Field(None, ge=0, le=MAX_LOOK_MATCHES)
    detail: str | None = Field(None, description="the task the images are shown for: caption, chat, ocr, "
                               "grounding, video-frame (a 400 names the choices)")
    find: str | None = Field(None, description="what to find: the answer is its boxes on the photo "
                             "(Qwen-VL families)")


class _OpenAISampled(_Open):
    """The fields OpenAI's chat and text completions share: the model, streaming, the sampler."""

    model: str | None = None
    stream: bool | None = None
    max_tokens: AnswerTokens | None = None
    temperature: Temperature | None = None
    top_p: Share | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: Stop | None = None


class ChatCompletionRequest(_OpenAISampled):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: AnswerTokens | None = None
    response_format: dict[str, Any] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: str | dict[str, Any] | None = None
    edgevlm: EdgevlmOptions | None = None

    @property
    def answer_tokens(self) -> int | None:
        """The answer's length asked for: OpenAI's newer field, else the older one."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class OllamaMessage(_Open):
    role: Role
    content: str | None = None
    images: list[str] | None = Field(None, description="base64-encoded images")
    tool_calls: list[ToolCallEntry] | None = None
    tool_name: str | None = None
    name: str | None = Field(None, description="the tool's name, as older clients send it")


class OllamaOptions(_Open):
    """Ollama's `options`: the sampler's (as Ollama names them), and edgevlm's own pool and merge."""

    num_predict: Literal[-1, -2] | AnswerTokens | None = Field(
        None, description="the answer's length; -1 or -2: the server's")
    stop: Stop | None = None
    temperature: Temperature | None = None
    top_p: Share | None = None
    min_p: Share | None = None
    top_k: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    seed: Seed | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repeat_penalty: Annotated[float, Field(ge=0, le=10)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1, le=1 << 20)] | None = None
    pool: Literal["auto", 1, 2] | None = None
    merge: Annotated[float, Field(gt=0, le=1)] | Annotated[str, Field(max_length=80)] | None = None


class OllamaChatRequest(_Open):
    """`POST /api/chat` (no messages: load the model, or unload it with keep_alive 0)."""

    model: str | None = None
    messages: list[OllamaMessage] | None = None
    stream: bool | None = None
    format: str | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    tools: list[ToolDefinition] | None = None
    keep_alive: float | str | None = None


class OllamaGenerateRequest(_Open):
    """`POST /api/generate` (no prompt: load the model, or unload it with keep_alive 0)."""

    model: str | None = None
    prompt: str | None = None
    system: str | None = None
    images: list[str] | None = None
    stream: bool | None = None
    format: str | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    keep_alive: float | str | None = None
    context: list[int] | None = Field(None, description="the context an earlier answer gave, to continue")


class OllamaModelRequest(_Open):
    """`POST /api/show`, `/api/pull`, `/api/embed`: a model's name."""

    model: str | None = None
    name: str | None = None
    stream: bool | None = None

    @property
    def named(self) -> str | None:
        """The model it names: `model`, or `name` as older clients send it."""
        return self.model if self.model is not None else self.name


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


class OllamaError(BaseModel):
    error: str


class CompletionRequest(_OpenAISampled):
    """`POST /v1/completions`."""

    prompt: NonBlank | list[NonBlank] = Field(description="one prompt (a list of one is taken too)")


class ResponseInputPart(_Open):
    type: Literal["input_text", "input_image", "input_file", "output_text", "text"]
    text: str | None = None
    image_url: str | None = None
    file_data: str | None = Field(None, description="input_file: a data:application/pdf;base64 URL")
    filename: str | None = None
    file_id: str | None = Field(None, description="an upload's id from POST /v1/files")
    detail: Literal["auto", "low", "high"] | None = None


class ResponseInputMessage(_Open):
    type: Literal["message"] | None = Field(None, description="function call items are refused")
    role: Role
    content: str | list[ResponseInputPart] | None = None


class ResponseRequest(_Open):
    """`POST /v1/responses`."""

    model: str | None = None
    input: NonBlank | Annotated[list[ResponseInputMessage], Field(min_length=1)]
    instructions: str | None = None
    stream: bool | None = None
    max_output_tokens: AnswerTokens | None = None
    temperature: Temperature | None = None
    top_p: Share | None = None
    text: dict[str, Any] | None = Field(None, description="the answer's format: {\"format\": {\"type\": …}}")
    metadata: dict[str, Any] | None = None


BODIES = (ChatCompletionRequest, CompletionRequest, ResponseRequest, OllamaChatRequest,
          OllamaGenerateRequest, OllamaModelRequest)


# A request that works as written, for /docs readers (and the fuzzer's explicit phase).
EXAMPLES: dict[str, dict[str, Any]] = {
    "ChatCompletionRequest": {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8},
}


def body(model: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra` that declares its JSON request body (with an example, if any)."""
    media: dict[str, Any] = {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
    if model.__name__ in EXAMPLES:
        media["example"] = EXAMPLES[model.__name__]
    return {"requestBody": {"required": True, "content": {"application/json": media}}}


def errors(model: type[BaseModel], *statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error responses a route may give, in its API's shape."""
    return {status: {"model": model, "description": "an error in the API's shape"} for status in statuses}


def streamed(media_type: str) -> dict[int | str, dict[str, Any]]:
    """A 200 that is JSON, or a stream when the request asks for one."""
    # An SSE stream is checked event by event ({"event", "data"}); NDJSON as its text.
    item = ({"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
            if media_type == "text/event-stream" else {"type": "string"})
    return {200: {"description": "the answer; a stream when `stream` is true",
                  "content": {"application/json": {}, media_type: {"schema": item}}}}


def add_bodies(openapi: dict[str, Any]) -> dict[str, Any]:
    """Put the request bodies' schemas (and those they use) into the OpenAPI components."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in BODIES:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return openapi


@functools.cache
def _components() -> dict[str, Any]:
    return add_bodies({})["components"]["schemas"]


@functools.cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": {"schemas": _components()}}
    return jsonschema.Draft202012Validator(schema)


Body = TypeVar("Body", bound=BaseModel)


def parse(model: type[Body], body: dict[str, Any]) -> Body:
    """The body as its model, or a 400 naming the field (in JSON's words) where it breaks the
    schema `/openapi.json` publishes for it."""
    check_body(model, body)
    try:
        return model.model_validate(body)
    except ValidationError as exc:  # where pydantic is stricter than the schema it publishes
        error = exc.errors()[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
        raise bad_request(error["msg"], where.lstrip(".") or None) from None


def check_body(model: type[BaseModel], body: dict[str, Any]) -> None:
    """A 400 naming the field unless the body keeps to the schema `/openapi.json` publishes for it."""
    error = jsonschema.exceptions.best_match(_validator(model.__name__).iter_errors(body))
    if error is None:
        return
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
    raise bad_request(f"{_reason(error)} (see /openapi.json)", where.lstrip(".") or None)


def _reason(error: jsonschema.ValidationError) -> str:
    """What the schema wanted, in JSON's words (jsonschema writes Python's: False, None)."""
    got = json.dumps(error.instance, ensure_ascii=False)
    got = got if len(got) <= 40 else got[:40] + "…"
    if error.validator in ("anyOf", "oneOf", "type"):
        schema = error.schema if isinstance(error.schema, dict) else {}
        options = schema.get(error.validator, []) if error.validator != "type" else [schema]
        wanted = [_kind(option) for option in options if isinstance(option, dict)]
        return f"expected {' or '.join(dict.fromkeys(w for w in wanted if w))}, got {got}"
    return error.message if len(error.message) <= 200 else error.message[:200] + "…"


def _kind(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return "an object (" + schema["$ref"].rsplit("/", 1)[-1] + ")"
    if "enum" in schema or "const" in schema:
        return " or ".join(json.dumps(v) for v in schema.get("enum", [schema.get("const")]))
    kind = schema.get("type")
    return {"null": "null", "boolean": "true or false", "integer": "a whole number", "number": "a number",
            "string": "a string", "array": "a list", "object": "an object"}.get(str(kind), str(kind or ""))
