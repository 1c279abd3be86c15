"""Parallel sequences against real llama.cpp: isolation, per-sequence ledgers, cancellation,
and folder captioning with --parallel (test models: words are meaningless, mechanics real).

Numerical tolerance: a prompt prefilled in one sequence while others hold their own prompts
gives the same last-token logits as alone to within LOGIT_TOLERANCE. llama.cpp may pick other
kernels for other batch shapes (a decode step carrying four tokens instead of one), so greedy
answers decoded side by side can part from the answer given alone after some tokens; the
tests below check completeness and the ledger, and the answer's first token, which comes from
the prefill alone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.prompts import detect_format
from edgevlm.errors import Interrupted
from edgevlm.llama.engine import Engine
from edgevlm.llama.types import EngineConfig
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import load_image

from ..conftest import TEXT_MODEL, make_conversation

LOGIT_TOLERANCE = 1e-3
PROMPT = "<|im_start|>user\nThe capital of France is a city called<|im_end|>\n<|im_start|>assistant\n"
OTHERS = ["Dogs and cats and parrots, " * 4, "Numbers: 1 2 3 4 5 6 7 8 9 " * 3,
          "Another language entirely. " * 5]


@pytest.fixture(scope="module")
def engine4(test_models: dict[str, Path]) -> Iterator[Engine]:
    eng = Engine(EngineConfig(TEXT_MODEL, test_models["mmproj_112"], n_ctx=1024, n_gpu_layers=0, n_seq=4))
    yield eng
    eng.close()


def _logits_alone(prompt: str) -> np.ndarray:
    with Engine(EngineConfig(TEXT_MODEL, None, n_ctx=1024, n_gpu_layers=0)) as engine:
        alone = engine.sequence()
        alone.eval_text(alone.tokenize(prompt))
        return alone._current_logits().copy()


def _clear(engine: Engine) -> None:
    for sequence in engine.sequences():
        sequence.clear_interrupt()
        sequence.truncate(0)


def test_a_sequence_sees_only_its_own_tokens(engine4: Engine) -> None:
    _clear(engine4)
    first, *others = engine4.sequences()
    for sequence, text in zip(others, OTHERS, strict=True):
        sequence.eval_text(sequence.tokenize(text))
    first.eval_text(first.tokenize(PROMPT))
    side_by_side = first._current_logits().copy()
    alone = _logits_alone(PROMPT)
    assert np.abs(side_by_side - alone).max() <= LOGIT_TOLERANCE
    leaked = _logits_alone(OTHERS[0] + PROMPT)  # what seeing sequence 1's tokens would give
    assert np.abs(leaked - alone).max() > 100 * LOGIT_TOLERANCE  # so the check above can fail
    assert all(s.n_past == s.kv_cells() for s in engine4.sequences())
    assert engine4.n_ctx == 1024 and [s.seq_id for s in engine4.sequences()] == [0, 1, 2, 3]


def test_a_short_prefill_waits_one_step_not_for_a_long_one_ahead(test_models: dict[str, Path]) -> None:
    """Issue 39.6: a client's small request during another's long history prefill waited for all
    of it (prefills were strictly FIFO); a short one now rides in the next step."""
    import threading

    with Engine(EngineConfig(TEXT_MODEL, None, n_ctx=2048, n_gpu_layers=0, n_seq=2, n_batch=64,
                             n_ubatch=64)) as engine:
        long, short = engine.sequences()
        history = long.tokenize("A long history of many turns, resent in full. " * 120)[:1500]
        reading = threading.Thread(target=long.eval_text, args=(history,))
        reading.start()
        deadline = time.monotonic() + 60
        while long.n_past < 64 and time.monotonic() < deadline:  # its first step is done
            time.sleep(0.001)
        before = long.n_past
        short.eval_text(short.tokenize("And one more question?"))
        waited = long.n_past - before
        reading.join()
        assert 0 < before < len(history) and long.n_past == len(history) == long.kv_cells()
        assert waited <= 2 * 64, waited  # the step in flight and the one it rode in, not 1500 tokens
        assert short.n_past == short.kv_cells() > 0


def test_concurrent_generation_keeps_every_ledger(engine4: Engine) -> None:
    _clear(engine4)
    answers: dict[int, list[int]] = {}

    def run(index: int) -> None:
        sequence = engine4.sequences()[index]
        sequence.eval_text(sequence.tokenize(PROMPT + OTHERS[index % 3]))
        text = "".join(sequence.generate(24, Sampling(temperature=0.0)))
        answers[index] = list(sequence.last_completion_tokens)
        assert text and sequence.n_past == sequence.kv_cells()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(answers) == [0, 1, 2, 3]
    assert answers[0] and answers[3]  # the same prompt: the same first token, from the same prefill
    assert answers[0][0] == answers[3][0]
    for sequence in engine4.sequences():
        assert sequence.n_past == sequence.kv_cells()
        sequence.truncate(0)
        assert sequence.kv_cells() == 0  # freed at once, the others untouched


def _photo(tmp: Path, seed: int) -> Path:
    path = tmp / f"p{seed}.png"
    pixels = np.random.default_rng(seed).integers(0, 255, (200, 300, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_conversations_side_by_side_swap_and_cancel(engine4: Engine, tmp_path: Path) -> None:
    _clear(engine4)
    fmt = detect_format(None, preset_format="chatml")
    conversations = [make_conversation(s, fmt, tile_size=112, max_tokens=16, summary="answer", max_tiles=2)
                     for s in engine4.sequences()]
    shown: dict[int, list[str]] = {}

    def chat(index: int) -> None:
        conversation = conversations[index]
        for turn in range(2):
            image = load_image(_photo(tmp_path, index * 10 + turn))
            pieces = shown.setdefault(index, [])
            pieces.clear()

            def on_piece(text: str, pieces: list[str] = pieces, turn: int = turn) -> None:
                pieces.append(text)
                if index == 3 and turn == 1 and len(pieces) == 2:
                    raise Interrupted("the client went away")  # as the server cancels a stream
            conversation.ask("What is this?", image=image, on_piece=on_piece)
            conversation.check()  # the ledger, after every turn, swap and cancel
        conversation.summarise_pending()  # idle time, batched with the other sequences' turns
        conversation.check()

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    for conversation in conversations:
        assert len(conversation.records) == 2 and all(r.answer for r in conversation.records)
        assert conversation.visual_tokens_live == 0  # answered images were swapped for summaries
        conversation.check()
    cancelled = conversations[3].records[1]
    assert cancelled.answer == "".join(shown[3]).strip()  # stopped where the client left
    assert all(len(shown[i]) > 2 for i in range(3))  # the other streams went on


def test_folder_captioning_in_parallel_matches_one_at_a_time(test_models: dict[str, Path],
                                                            tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from edgevlm.cli.app import app

    folder = tmp_path / "photos"
    folder.mkdir()
    for seed in range(6):
        _photo(folder, seed)
    (folder / "broken.jpg").write_bytes(b"not a jpeg")
    args = ["describe", str(folder), "-m", str(test_models["text"]),
            "--mmproj", str(test_models["mmproj_112"]), "--max-tokens", "8", "--tiles", "0",
            "--write-captions", "-q", "--n-ctx", "1024"]
    runs = {}
    for parallel in ("1", "4"):
        log = tmp_path / f"run{parallel}.jsonl"
        result = CliRunner().invoke(app, [*args, "--parallel", parallel, "--jsonl", str(log), "--overwrite"])
        assert result.exit_code == 2, result.output  # the broken file fails, the rest are captioned
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        runs[parallel] = {row["image"]: row for row in rows}
        captions = sorted(p.name for p in folder.glob("*.txt"))
        assert captions == [f"p{seed}.png.txt" for seed in range(6)]
    assert runs["1"].keys() == runs["4"].keys() and len(runs["4"]) == 6
    for image, row in runs["4"].items():
        assert row["completion_tokens"] > 0 and row["n_ctx"] == 1024
        assert row["text"].split()[:1] == runs["1"][image]["text"].split()[:1]  # the prefill's token
    written = {p: p.stat().st_mtime_ns for p in folder.glob("*.txt")}
    again = CliRunner().invoke(app, [*args, "--parallel", "4", "--jsonl", str(tmp_path / "run4.jsonl")])
    assert again.exit_code == 2 and "broken.jpg" in again.output  # only the broken file is retried
    assert len((tmp_path / "run4.jsonl").read_text().splitlines()) == 6  # resume: nothing redone
    assert {p: p.stat().st_mtime_ns for p in folder.glob("*.txt")} == written


# -- serve --parallel 4 -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def parallel_server(test_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[str, object]]:
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.runtime.loading import ModelFlags, load
    from edgevlm.server.launch import ServeSettings, build_state

    from ..server.test_app import serving

    with pytest.MonkeyPatch.context() as patch:  # module fixtures start before the per-test isolation
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("parallel-cache")))
        loaded = load(ModelFlags(model=str(test_models["text"]), mmproj=str(test_models["mmproj_112"]),
                                 n_ctx=1024, n_gpu_layers=0, answer_tokens=16, parallel=4))
        state = build_state(loaded, ServeSettings(chat=ChatSettings(max_tokens=16, pool=None),
                                                  max_queue=16, cache=False))
        assert state.scheduler.slots == 4 and loaded.plan.n_seq == 4
        with serving(state) as url:
            yield url, state
    loaded.engine.close()


def _drained(state: object) -> None:
    state.scheduler.drain()
    for session in state.scheduler.sessions:
        session.conversation.check()


def test_eight_clients_on_four_slots(parallel_server: tuple[str, object]) -> None:
    from openai import OpenAI

    from ..server.test_app import image_message

    client = OpenAI(base_url=f"{parallel_server[0]}/v1", api_key="unused", max_retries=0, timeout=300)
    requests = [[{"role": "user", "content": f"Name a thing number {i}."}] if i % 2 else
                [image_message(f"Photo {i}?", seed=300 + i, detail="low")] for i in range(8)]

    def ask(messages: list[dict[str, object]]) -> tuple[str, str]:
        reply = client.chat.completions.create(model="", messages=messages, temperature=0)
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason

    alone = [ask(m) for m in requests]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, requests))
    for (text, reason), (text_alone, _) in zip(together, alone, strict=True):
        assert text and reason in ("stop", "length")  # every answer complete
        assert text.split()[:1] == text_alone.split()[:1]  # see LOGIT_TOLERANCE: the prefill's token
    same = sum(a == b for a, b in zip(together, alone, strict=True))
    assert len({t for t, _ in alone}) > 1  # the answers differ, so a mix-up would show
    print(f"{same} of 8 answers identical to the request alone")
    _drained(parallel_server[1])


def test_cancelling_one_stream_leaves_the_others(parallel_server: tuple[str, object]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{parallel_server[0]}/v1", api_key="unused", max_retries=0, timeout=300)

    def stream(index: int) -> str:
        chunks = client.chat.completions.create(
            model="", stream=True, max_tokens=16, temperature=0,
            messages=[{"role": "user", "content": f"Count from {index} upwards."}])
        text = ""
        for seen, chunk in enumerate(chunks):
            text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            if index == 0 and seen == 2:
                chunks.close()  # this client leaves
                return "left"
        return text

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(stream, range(3)))
    assert results[0] == "left" and results[1] and results[2]
    _drained(parallel_server[1])
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(stream, 1).result() == results[1]  # alone, the same answer
