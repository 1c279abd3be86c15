"""A client's message list folded into history and the latest message (no model needed)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from edgevlm.chat.resent import ChatImage
from edgevlm.chat.settings import ChatSettings, SettingsChange
from edgevlm.server.history import Message
from edgevlm.server.history import chat_turn as fold
from edgevlm.server.http import ApiError

OPTIONS = SettingsChange(max_tokens=16)


def chat_turn(messages: list[Message], change: SettingsChange) -> object:  # noqa: F811
    """history.chat_turn with the settings merged onto the defaults (a server's)."""
    return fold(messages, change, ChatSettings().merged)


def _image(colour: tuple[int, int, int]) -> ChatImage:
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), colour).save(buf, "PNG")
    return ChatImage.from_bytes(buf.getvalue())


def test_history_pairs_up_and_the_last_user_message_is_asked() -> None:
    red, blue = _image((255, 0, 0)), _image((0, 0, 255))
    turn = chat_turn([
        Message("system", "Be brief.", where="messages[0]"),
        Message("user", "What is this?", (red,), "messages[1]"),
        Message("assistant", "A red card.", where="messages[2]"),
        Message("user", "And this?", (blue,), "messages[3]"),
    ], OPTIONS)
    assert turn.settings.system == "Be brief." and turn.settings.max_tokens == 16
    assert [(p.user, p.answer, p.image) for p in turn.past] == [("What is this?", "A red card.", red)]
    assert turn.question == "And this?" and turn.image == blue


def test_uploads_are_named_by_their_digest() -> None:
    red = _image((255, 0, 0))
    assert red.image.path.name == f"image-{red.sha256[:8]}"
    assert _image((255, 0, 0)).sha256 == red.sha256 != _image((0, 255, 0)).sha256


@pytest.mark.parametrize(("messages", "param", "words"), [
    ([], "messages", "at least one message"),
    ([Message("user", "hi", where="messages[0]"), Message("assistant", "yo", where="messages[1]")],
     "messages[1].role", "must be from the user"),
    ([Message("user", "  ", where="messages[0]")], "messages[0]", "no text and no image"),
])
def test_bad_histories_name_the_message(messages: list[Message], param: str, words: str) -> None:
    with pytest.raises(ApiError) as caught:
        chat_turn(messages, OPTIONS)
    assert caught.value.status == 400 and caught.value.param == param
    assert words in caught.value.message


def test_several_images_in_one_message_stay_in_order_in_the_turn_and_its_history() -> None:
    red, green, blue = _image((1, 2, 3)), _image((4, 5, 6)), _image((7, 8, 9))
    turn = chat_turn([Message("user", "compare", (red, green), "messages[0]"),
                      Message("assistant", "The first is red.", where="messages[1]"),
                      Message("user", "and", (blue,), "messages[2]"),
                      Message("user", "this?", (red,), "messages[3]")], OPTIONS)
    assert turn.past[0].images == (red, green) and turn.past[0].image == red
    assert turn.past[0].image_key == f"{red.image.path.name}|{green.image.path.name}"
    assert turn.images == (blue, red) and turn.question == "and\n\nthis?"
