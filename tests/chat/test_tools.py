"""The generic tool-call format: what the model is shown, the grammar's shape, calls read back."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgevlm.chat.structured import OutputFormat
from edgevlm.chat.tools import ToolSpec, ToolUse, call_text
from edgevlm.errors import ConfigError
from edgevlm.server.answer import PLAIN, AnswerShape, AnswerText
from edgevlm.server.http import ApiError

WEATHER = ToolSpec("get_weather", "The forecast.", {
    "type": "object", "required": ["city", "days"], "additionalProperties": False,
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1}}})
CLOCK = ToolSpec("get_time", "The time.", {})


def test_the_prompt_lists_every_tool_and_the_choice() -> None:
    auto, named = ToolUse((WEATHER, CLOCK)), ToolUse((WEATHER, CLOCK), "get_time")
    assert '"name": "get_weather"' in auto.prompt() and '"name": "get_time"' in auto.prompt()
    assert "otherwise answer in plain text" in auto.prompt()
    assert "You must call the tool get_time" in named.prompt()


def test_a_forced_call_may_only_name_the_chosen_tool() -> None:
    named = ToolUse((WEATHER, CLOCK), "get_time")
    assert '"\\"get_time\\""' in named.grammar and "get_weather" not in named.grammar
    assert "edgevlm-text" not in named.grammar  # no plain text allowed
    assert "edgevlm-text" in ToolUse((WEATHER,)).grammar


def test_calls_are_read_back_and_checked() -> None:
    use = ToolUse((WEATHER, CLOCK), "required")
    call = use.parse('{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}')
    assert call is not None and call.name == "get_weather" and call.arguments == {"city": "Rome", "days": 2}
    assert json.loads(call.arguments_json) == call.arguments and call.id.startswith("call_")
    with pytest.raises(ValueError, match="minimum|less than"):  # what the grammar cannot hold
        use.parse('{"name": "get_weather", "arguments": {"city": "Rome", "days": 0}}')
    with pytest.raises(ValueError, match="no offered tool"):
        use.parse('{"name": "rm", "arguments": {}}')
    with pytest.raises(ValueError, match="not a tool call"):
        use.parse("plain words")
    assert ToolUse((WEATHER,)).parse("plain words") is None  # auto: text is text


def test_bad_tool_sets_are_refused() -> None:
    with pytest.raises(ConfigError, match="share a name"):
        ToolUse((WEATHER, WEATHER))
    with pytest.raises(ConfigError, match="not among"):
        ToolUse((WEATHER,), "get_time")
    loop = ToolSpec("walk", "", {"$defs": {"N": {"properties": {"n": {"$ref": "#/$defs/N"}}}},
                                 "$ref": "#/$defs/N"})
    with pytest.raises(ConfigError, match="recursive"):
        ToolUse((loop,))


def test_a_resent_call_is_written_as_the_model_writes_it() -> None:
    text = call_text("get_weather", {"city": "Rome", "days": 2})
    call = ToolUse((WEATHER,)).parse(text)
    assert call is not None and call.arguments == {"city": "Rome", "days": 2}


@given(st.lists(st.text(alphabet=" \n\tab{}", max_size=6), max_size=8))
def test_a_stream_sends_what_the_whole_answer_shows(pieces: list[str]) -> None:
    """Streamed pieces, trimmed as they go, add up to the whole answer stripped."""
    answer = AnswerText(PLAIN)
    sent = "".join(answer.feed(p) for p in pieces)
    rest, call = answer.finish(cut=False)
    assert call is None and sent + rest == PLAIN.read("".join(pieces), cut=False)[0]


@given(st.lists(st.text(alphabet=" \nab{}\"", max_size=6), max_size=8))
def test_with_tools_a_stream_agrees_with_the_whole_answer(pieces: list[str]) -> None:
    shape = AnswerShape(ToolUse((CLOCK,)))
    answer = AnswerText(shape)
    sent = "".join(answer.feed(p) for p in pieces)
    rest, call = answer.finish(cut=True)  # cut off: a broken call is no answer, not an error
    whole_text, whole_call = shape.read("".join(pieces), cut=True)
    assert sent + rest == whole_text and (call is None) == (whole_call is None)


def test_an_answer_that_ended_without_its_shape_is_an_error_not_an_empty_success() -> None:
    """Issue 49.5: a required call whose arguments failed the check came back as content "" and
    finish_reason stop (12 of 12), and a response_format answer out of its bounds as a success."""
    required = AnswerShape(ToolUse((WEATHER,), "required"))
    bad_call = '{"name": "get_weather", "arguments": {"city": "Rome", "days": 0}}'
    with pytest.raises(ApiError, match="less than the minimum of 1") as refused:
        required.read(bad_call, cut=False)
    assert refused.value.status == 422 and refused.value.code == "answer_mismatch"
    assert required.read(bad_call[:30], cut=True) == ("", None)  # cut off: the finish reason says so
    bounded = AnswerShape(output=OutputFormat("schema", {"type": "number", "minimum": 0, "maximum": 1}))
    assert bounded.read(" 0.5 ", cut=False) == ("0.5", None)
    with pytest.raises(ApiError, match="greater than the maximum"):
        bounded.read("1.5", cut=False)


def test_a_streamed_call_is_held_whole() -> None:
    answer = AnswerText(AnswerShape(ToolUse((CLOCK,))))
    pieces = [" ", '{"name": ', '"get_time", "arguments": ', "{}}"]
    assert [answer.feed(p) for p in pieces] == ["", "", "", ""]
    rest, call = answer.finish(cut=False)
    assert rest == "" and call is not None and call.name == "get_time"
