"""OpenAI's Files API (issue 53), with the `openai` client on the fake engine: an upload is kept,
listed, fetched and deleted; its file_id stands for an image, a PDF or a clip in a message; it
is read ahead in idle time, so the question that names it decodes only itself; an unknown or
deleted id and every cap are refused in OpenAI's shape, with nothing kept."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from edgevlm.chat.settings import ChatSettings
from edgevlm.server.launch import ServeSettings, build_state
from edgevlm.server.turns import ServerState
from edgevlm.store.uploads import UploadKind, UploadRefused, UploadStore

from ..fakes import fake_loaded
from ..vision.test_video import moving_square, write_clip
from .test_app import MAX_TOKENS, image_message, photo_bytes, serving
from .test_documents_cost import blank_pdf


@pytest.fixture(scope="module")
def files_server(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[OpenAI, ServerState]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("files-cache")))
        loaded = fake_loaded(test_models["text"], test_models["mmproj_112"], answer_tokens=MAX_TOKENS,
                             step_s=0.002)
        state = build_state(loaded, ServeSettings(chat=ChatSettings(max_tokens=MAX_TOKENS, pool=None),
                                                  max_queue=8, max_body_mb=2, cache=True))
        with serving(state) as url:
            yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120), state


def _file_message(text: str, file_id: str) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "file", "file": {"file_id": file_id}}]}


def test_an_uploaded_photo_is_read_ahead_and_its_question_decodes_only_itself(
        files_server: tuple[OpenAI, ServerState]) -> None:
    client, state = files_server
    inline = client.chat.completions.create(model="", messages=[image_message("What is it?", seed=71)])
    state.scheduler.drain()
    stored = client.files.create(file=("photo.png", io.BytesIO(photo_bytes(72)), "image/png"),
                                 purpose="vision")
    assert stored.id.startswith("file-") and stored.bytes == len(photo_bytes(72))
    assert stored.filename == "photo.png" and stored.purpose == "vision"
    assert stored.expires_at > stored.created_at
    state.scheduler.drain()  # the read ahead ran in idle time
    named = client.chat.completions.create(model="", messages=[_file_message("What is it?", stored.id)])
    ahead, whole = named.model_extra["edgevlm"], inline.model_extra["edgevlm"]
    assert named.choices[0].message.content
    assert ahead["clip_encodes"] == 0 < whole["clip_encodes"] and ahead["prefix_cache"] == "ram"
    assert ahead["visual_tokens"] == whole["visual_tokens"]
    assert ahead["prefill_tokens"] < whole["prefill_tokens"] // 4
    assert [f.id for f in client.files.list().data][0] == stored.id
    assert client.files.retrieve(stored.id).bytes == stored.bytes
    assert client.files.content(stored.id).content == photo_bytes(72)
    assert client.files.delete(stored.id).deleted
    with pytest.raises(openai.NotFoundError) as gone:
        client.files.retrieve(stored.id)
    assert gone.value.body["code"] == "file_not_found"
    with pytest.raises(openai.BadRequestError) as named_gone:
        client.chat.completions.create(model="", messages=[_file_message("And now?", stored.id)])
    assert named_gone.value.body["param"] == "messages[0].content[1].file.file_id"
    state.scheduler.drain()
    state.scheduler.session.conversation.check()


def test_an_uploaded_pdf_and_clip_show_their_pages_and_frames_and_the_responses_api_takes_an_image_by_id(
        files_server: tuple[OpenAI, ServerState], tmp_path: Path) -> None:
    client, state = files_server
    pdf = client.files.create(file=("two.pdf", io.BytesIO(blank_pdf(2, (300, 400))), "application/pdf"),
                              purpose="user_data")
    state.scheduler.drain()
    answer = client.chat.completions.create(model="", messages=[_file_message("Read it.", pdf.id)])
    assert len(answer.model_extra["edgevlm"]["image_tokens"]) == 2  # a page each
    assert answer.model_extra["edgevlm"]["clip_encodes"] == 0  # read ahead in idle time
    photo = client.files.create(file=("p.png", io.BytesIO(photo_bytes(73)), "image/png"), purpose="vision")
    response = client.responses.create(model="", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"}, {"type": "input_image", "file_id": photo.id}]}])
    assert response.output_text and response.model_extra["edgevlm"]["visual_tokens"] > 0
    clip = write_clip(tmp_path / "clip.mp4", 6, draw=moving_square)
    video = client.files.create(file=("clip.mp4", io.BytesIO(clip.read_bytes()), "video/mp4"),
                                purpose="vision")
    state.scheduler.drain()
    watched = client.chat.completions.create(model="", messages=[_file_message("What moves?", video.id)])
    assert len(watched.model_extra["edgevlm"]["image_tokens"]) > 1  # the clip's frames, each a block
    assert watched.model_extra["edgevlm"]["clip_encodes"] == 0  # read ahead in idle time
    for stored in (pdf, photo, video):
        client.files.delete(stored.id)
    state.scheduler.drain()


def test_what_an_upload_may_not_be_is_refused_and_nothing_is_kept(
        files_server: tuple[OpenAI, ServerState], monkeypatch: pytest.MonkeyPatch) -> None:
    client, state = files_server
    kept = len(client.files.list().data)
    with pytest.raises(openai.BadRequestError) as purpose:
        client.files.create(file=("p.png", io.BytesIO(photo_bytes(74)), "image/png"), purpose="fine-tune")
    assert purpose.value.body["param"] == "purpose"
    with pytest.raises(openai.BadRequestError) as not_media:
        client.files.create(file=("notes.txt", io.BytesIO(b"just some words"), "text/plain"),
                            purpose="vision")
    assert not_media.value.body["code"] == "invalid_file"
    with pytest.raises(openai.APIStatusError) as too_large:  # past --max-body-mb (2 MiB here)
        client.files.create(file=("big.png", io.BytesIO(b"\x89PNG" + bytes(3 << 20)), "image/png"),
                            purpose="vision")
    assert too_large.value.status_code == 413
    monkeypatch.setattr(state, "uploads", UploadStore(None, max_files=1))
    client.files.create(file=("a.png", io.BytesIO(photo_bytes(75)), "image/png"), purpose="vision")
    with pytest.raises(openai.BadRequestError) as too_many:
        client.files.create(file=("b.png", io.BytesIO(photo_bytes(76)), "image/png"), purpose="vision")
    assert too_many.value.body["code"] == "too_many_files" and len(client.files.list().data) == 1
    monkeypatch.undo()
    assert len(client.files.list().data) == kept
    raw = httpx.post(str(client.base_url) + "files", content=b"{}",
                     headers={"content-type": "application/json"})
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_content_type"
    state.scheduler.drain()


def test_uploads_expire_and_stay_within_their_caps(tmp_path: Path) -> None:
    now = [1000.0]
    store = UploadStore(tmp_path / "uploads", ttl_s=60, max_files=3, max_total_bytes=100,
                        clock=lambda: now[0])

    first = store.add(b"x" * 40, filename="a", purpose="vision", kind=UploadKind.IMAGE)
    store.add(b"y" * 40, filename="b", purpose="vision", kind=UploadKind.IMAGE)
    with pytest.raises(UploadRefused) as full:
        store.add(b"z" * 40, filename="c", purpose="vision", kind=UploadKind.IMAGE)
    assert full.value.too_large and len(store.listed()) == 2
    assert len(list((tmp_path / "uploads").iterdir())) == 2
    assert store.read(first.id) == b"x" * 40
    now[0] += 61  # both expire: their bytes go with them
    assert store.get(first.id) is None and store.read(first.id) is None and not store.listed()
    assert not list((tmp_path / "uploads").iterdir())
    store.add(b"z" * 40, filename="c", purpose="vision", kind=UploadKind.IMAGE)
    assert UploadStore(tmp_path / "uploads").listed() == [] and not list((tmp_path / "uploads").iterdir())


def test_a_read_ahead_stopped_by_a_request_leaves_the_slot_whole(
        files_server: tuple[OpenAI, ServerState]) -> None:
    """A request given the slot stops an upload's read ahead at its next step, perhaps while the
    slot starts over from its system prompt: the request then finds the system prompt, never a
    torn cache (the page sent a question before its photo was read: a 500)."""
    from edgevlm.chat.resent import ChatImage
    from edgevlm.errors import Interrupted

    client, state = files_server
    image = ChatImage.from_bytes(photo_bytes(77))

    def stopped_at_once(session: object) -> object:
        session.conversation.interrupt()  # as the dispatcher's cancel does, before the reset's decode
        return session.read_ahead([image], state.chat)

    future = state.scheduler.read_ahead(stopped_at_once)
    assert future is not None and isinstance(future.exception(timeout=60), Interrupted)
    state.scheduler.drain()
    conversation = state.scheduler.session.conversation
    conversation.check()
    assert [s.kind for s in conversation.segments] == ["system"]
    answer = client.chat.completions.create(model="", messages=[image_message("What is it?", seed=77)])
    assert answer.choices[0].message.content


def test_an_upload_is_named_by_its_file_and_a_later_question_may_name_it(
        files_server: tuple[OpenAI, ServerState]) -> None:
    """Its summary says the name the client gave the file, and a question naming that file gets
    it shown again (issue 52), from the projector-row cache."""
    client, state = files_server
    stored = client.files.create(file=("street-7.png", io.BytesIO(photo_bytes(78)), "image/png"),
                                 purpose="vision")
    state.scheduler.drain()
    first = client.chat.completions.create(model="", messages=[_file_message("What is it?", stored.id)])
    state.scheduler.drain()  # its summary, in idle time
    history = [_file_message("What is it?", stored.id),
               {"role": "assistant", "content": first.choices[0].message.content}]
    later = client.chat.completions.create(model="", messages=[
        *history, {"role": "user", "content": "What was in street-7.png again?"}])
    numbers = later.model_extra["edgevlm"]
    assert numbers["shown_again"] == [1] and numbers["clip_encodes"] == 0
    summaries = state.scheduler.session.conversation.records[0].shown
    assert summaries[0].image == "street-7.png"
    client.files.delete(stored.id)
    state.scheduler.drain()
