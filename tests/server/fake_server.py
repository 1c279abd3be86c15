"""`edgevlm serve` on the fake engine in a process of its own, for tests that need its limits
(open files) or its log: `python -m tests.server.fake_server PORT`. Prints `ready` once serving."""

from __future__ import annotations

import logging
import sys

from edgevlm.chat.settings import ChatSettings
from edgevlm.server.app import create_app, uvicorn_config
from edgevlm.server.launch import ServeSettings, build_state

from ..conftest import MMPROJ_112, TEXT_MODEL
from ..fakes import fake_loaded


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    import uvicorn

    state = build_state(fake_loaded(TEXT_MODEL, MMPROJ_112, answer_tokens=8, step_s=0.001),
                        ServeSettings(chat=ChatSettings(max_tokens=8, pool=None), cache=False))
    server = uvicorn.Server(uvicorn_config(create_app(state), host="127.0.0.1", port=int(sys.argv[1])))
    original = server.startup

    async def startup(sockets: object = None) -> None:
        await original(sockets)
        print("ready", flush=True)

    server.startup = startup
    server.run()


if __name__ == "__main__":
    main()
