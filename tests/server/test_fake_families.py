"""The server's flow for mtmd's families on the fake sequence (tests/fakes.py), in process: a
photo and a follow-up on the Qwen pair (M-RoPE: positions that differ from cells) and the Gemma
pair (two-way attention over its image), and a turn's settings checked against the family as
the CLI checks them. The same flows on real llama.cpp are in test_families.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import BadRequestError, OpenAI

from edgevlm.chat.settings import ChatSettings
from edgevlm.server.launch import ServeSettings, build_state
from edgevlm.server.turns import ServerState

from ..fakes import fake_loaded
from .test_app import image_message, serving

PAIRS = ["qwen", "gemma"]


@pytest.fixture(scope="module", params=PAIRS)
def served(request: pytest.FixtureRequest, test_models: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAI, ServerState, str]]:
    family = request.param
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp(f"{family}-cache")))
        loaded = fake_loaded(test_models[f"{family}_text"], test_models[f"{family}_mmproj"],
                             answer_tokens=16, step_s=0.001)
        state = build_state(loaded, ServeSettings(chat=ChatSettings(max_tokens=16, pool=None), cache=True))
        with serving(state) as url:
            yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60), state, family


def test_a_photo_then_a_follow_up_reuses_the_cache(served: tuple[OpenAI, ServerState, str]) -> None:
    client, state, family = served
    messages: list[dict[str, object]] = [image_message("What is in this photo?", seed=3)]
    first = client.chat.completions.create(model=state.model.id, messages=messages, temperature=0)
    numbers = first.model_extra["edgevlm"]
    assert numbers["visual_tokens"] > 0 and first.usage.completion_tokens > 0, family
    state.scheduler.drain()
    state.scheduler.session.conversation.check()  # the ledger, positions and cells alike
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And the colours?"}]
    second = client.chat.completions.create(model=state.model.id, messages=messages, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached >= second.usage.prompt_tokens - 40, (family, second.usage)
    state.scheduler.drain()
    state.scheduler.session.conversation.check()


def test_pool_on_a_family_that_pools_itself_is_refused_naming_the_field(
        served: tuple[OpenAI, ServerState, str]) -> None:
    """`--pool 2` is refused on these families by the CLI; `edgevlm.pool: 2` was silently ignored."""
    client, state, family = served
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model=state.model.id, messages=[image_message("What?", seed=4)],
                                       extra_body={"edgevlm": {"pool": 2}})
    assert refused.value.body["param"] == "edgevlm.pool", family
    assert "pool" in refused.value.body["message"]
    assert state.scheduler.session.conversation.settings.pool is None  # nothing was adopted


def test_a_multi_page_tiff_file_part_is_read_as_pages(served: tuple[OpenAI, ServerState, str],
                                                      tmp_path: Path) -> None:
    import base64

    from ..vision.test_documents import write_tiff

    client, state, family = served
    raw = write_tiff(tmp_path / "scan.tiff", [(850, 1100), (600, 800)]).read_bytes()
    part = {"type": "file", "file": {"filename": "scan.tiff",
                                     "file_data": "data:image/tiff;base64," + base64.b64encode(raw).decode()}}
    question = {"type": "text", "text": "Read it."}
    answer = client.chat.completions.create(model=state.model.id,
                                            messages=[{"role": "user", "content": [part, question]}])
    numbers = answer.model_extra["edgevlm"]
    assert len(numbers["image_tokens"]) == 2 and numbers["visual_tokens"] > 0, (family, numbers)
    not_a_tiff = {"type": "file", "file": {"file_data": "data:image/tiff;base64,"
                                                        + base64.b64encode(b"%PDF-1.4").decode()}}
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model=state.model.id,
                                       messages=[{"role": "user", "content": [not_a_tiff, question]}])
    assert refused.value.body["message"].endswith(": file_data is not a TIFF")


def test_a_resent_question_naming_an_earlier_photo_shows_it_again(
        served: tuple[OpenAI, ServerState, str]) -> None:
    """Issue 52 through the API: a message without images of its own that names "image 1" gets
    image 1 back live for its turn from the history's upload (its rows from the cache: no
    encode), and image 1 is its summary again after; the next resent request matches the cache."""
    client, state, family = served
    history: list[dict[str, object]] = []
    numbers = []
    for seed in (21, 22):
        history.append(image_message("What is in this photo?", seed=seed))
        answer = client.chat.completions.create(model=state.model.id, messages=history, temperature=0)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
        numbers.append(answer.model_extra["edgevlm"])
        state.scheduler.drain()
    history.append({"role": "user", "content": "What did image 1 show?"})
    looked = client.chat.completions.create(model=state.model.id, messages=history, temperature=0)
    shown = looked.model_extra["edgevlm"]
    assert shown["clip_encodes"] == 0 and shown["visual_tokens"] == numbers[0]["visual_tokens"], family
    state.scheduler.drain()
    state.scheduler.session.conversation.check()
    history += [{"role": "assistant", "content": looked.choices[0].message.content},
                {"role": "user", "content": "Thanks."}]
    after = client.chat.completions.create(model=state.model.id, messages=history, temperature=0)
    assert after.model_extra["edgevlm"]["visual_tokens_live"] == 0  # image 1 is its summary again
    assert after.usage.prompt_tokens - after.usage.prompt_tokens_details.cached_tokens < 40  # matched


def test_edgevlm_look_shows_the_images_it_names_and_refuses_ones_not_in_the_history(
        served: tuple[OpenAI, ServerState, str]) -> None:
    client, state, family = served
    first = image_message("What is in this photo?", seed=31)
    answer = client.chat.completions.create(model=state.model.id, messages=[first], temperature=0)
    shown = answer.model_extra["edgevlm"]["visual_tokens"]
    state.scheduler.drain()
    history = [first, {"role": "assistant", "content": answer.choices[0].message.content},
               {"role": "user", "content": "Is it brighter than the sky?"}]  # names no image
    plain = client.chat.completions.create(model=state.model.id, messages=history, temperature=0)
    assert plain.model_extra["edgevlm"]["visual_tokens"] == 0
    state.scheduler.drain()
    looked = client.chat.completions.create(model=state.model.id, messages=history, temperature=0,
                                            extra_body={"edgevlm": {"look": [1]}})
    assert looked.model_extra["edgevlm"]["visual_tokens"] == shown, family
    assert looked.model_extra["edgevlm"]["clip_encodes"] == 0
    assert looked.model_extra["edgevlm"]["shown_again"] == [1]  # the block says what came back
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model=state.model.id, messages=history,
                                       extra_body={"edgevlm": {"look": [2]}})
    assert refused.value.body["param"] == "edgevlm.look" and "no image 2" in refused.value.body["message"]


def test_look_matches_shows_again_the_photo_whose_summary_a_question_matches(
        served: tuple[OpenAI, ServerState, str]) -> None:
    """edgevlm.look_matches: a question naming no photo, sharing words with image 1's summary,
    gets image 1 back (no encode); one sharing none, or without the setting, gets none."""
    client, state, family = served
    first = image_message("What is in this photo?", seed=41)
    answer = client.chat.completions.create(model=state.model.id, messages=[first], temperature=0)
    shown = answer.model_extra["edgevlm"]["visual_tokens"]
    state.scheduler.drain()
    summary = state.scheduler.session.conversation.records[-1].shown[0].summary
    assert summary  # the fake's caption: "<digest>: a scripted answer after N positions."
    history = [first, {"role": "assistant", "content": answer.choices[0].message.content}]
    matching = [*history, {"role": "user", "content": "Was that the scripted answer with positions?"}]
    unmatched = [*history, {"role": "user", "content": "Was the sky blue?"}]
    plain = client.chat.completions.create(model=state.model.id, messages=matching, temperature=0)
    assert plain.model_extra["edgevlm"]["visual_tokens"] == 0  # off by default
    state.scheduler.drain()
    for messages, expected in ((unmatched, 0), (matching, shown)):
        reply = client.chat.completions.create(model=state.model.id, messages=messages, temperature=0,
                                               extra_body={"edgevlm": {"look_matches": 1}})
        assert reply.model_extra["edgevlm"]["visual_tokens"] == expected, family
        assert reply.model_extra["edgevlm"]["clip_encodes"] == 0
        state.scheduler.drain()
