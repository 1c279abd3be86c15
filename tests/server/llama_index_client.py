"""llama-index's OpenAILike against an edgevlm server, run by the llama-index venv's Python (its
openai<3 cannot share edgevlm's venv): `python llama_index_client.py URL MODEL` prints JSON.

Not a test module: tests/server/test_clients.py runs it as a client process would be run.
"""

import json
import sys

from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike


def main(url: str, model: str) -> None:
    """Its defaults (a completion model), a stream, and the chat route, each answered."""
    plain = OpenAILike(model=model, api_base=f"{url}/v1", api_key="unused", max_tokens=8)
    completed = plain.complete("The capital of France is")
    streamed = "".join(piece.delta or "" for piece in plain.stream_complete("Count: one, two,"))
    chat = OpenAILike(model=model, api_base=f"{url}/v1", api_key="unused", max_tokens=8,
                      is_chat_model=True)
    answered = chat.chat([ChatMessage(role="user", content="Hi there")])
    print(json.dumps({"complete": completed.text, "stream": streamed,
                      "chat": answered.message.content, "is_chat_model": plain.metadata.is_chat_model}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
