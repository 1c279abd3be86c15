"""From flags to a loaded engine: pairing checks, the plan, and the retry after a failed load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgevlm.errors import EngineError, ModelError
from edgevlm.runtime import loading as runtime
from edgevlm.runtime.loading import ModelFlags, load


def _flags(models: dict[str, Path], **extra: object) -> ModelFlags:
    return ModelFlags(str(models["text"]), str(models["mmproj_112"]), **extra)


def test_defaults_come_from_the_plan(test_models: dict[str, Path]) -> None:
    loaded = load(_flags(test_models, answer_tokens=64))
    try:
        assert loaded.engine.n_ctx == loaded.plan.n_ctx == 4096  # CPU plan, capped
        assert loaded.n_gpu_layers == 0 and loaded.prompt_format.name == "chatml"
    finally:
        loaded.engine.close()


def test_explicit_n_ctx_overrides_the_plan(test_models: dict[str, Path]) -> None:
    loaded = load(_flags(test_models, n_ctx=1024))
    try:
        assert loaded.engine.n_ctx == 1024
    finally:
        loaded.engine.close()


def test_a_failed_gpu_load_is_retried_once_with_a_smaller_plan(
        test_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    real_engine = runtime.Engine
    calls: list[int] = []

    def engine_that_runs_out_of_memory_once(config, **kwargs):  # noqa: ANN001, ANN202
        calls.append(config.n_ctx)
        if len(calls) == 1:
            raise EngineError("could not create a context (out of memory)")
        return real_engine(config, **kwargs)

    monkeypatch.setattr(runtime, "gpu_offload_supported", lambda: True)
    loaded = load(_flags(test_models, vram=(2 * 2**30,)), engine=engine_that_runs_out_of_memory_once)
    try:
        assert len(calls) == 2
        assert any("retried with a smaller plan" in note for note in loaded.plan.notes)
        assert loaded.plan.vram_free == int(2 * 2**30 * runtime.RETRY_VRAM_SHARE)
    finally:
        loaded.engine.close()


def test_the_retry_keeps_every_setting_but_the_context_and_layers(
        test_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the retry once dropped --swa-full, the projector's device and mtmd's block counts."""
    real_engine, real_choose = runtime.Engine, runtime.choose
    asked: list[runtime.Settings] = []

    def recording_choose(text, projector, device, settings):  # noqa: ANN001, ANN202
        asked.append(settings)
        return real_choose(text, projector, device, settings)

    def engine_that_runs_out_of_memory_once(config, **kwargs):  # noqa: ANN001, ANN202
        if len(asked) == 1:
            raise EngineError("could not create a context (out of memory)")
        return real_engine(config, **kwargs)

    monkeypatch.setattr(runtime, "choose", recording_choose)
    monkeypatch.setattr(runtime, "gpu_offload_supported", lambda: True)
    flags = ModelFlags(str(test_models["gemma_text"]), str(test_models["gemma_mmproj"]), vram=(2 * 2**30,),
                       swa_full=True, kv_type="f16", n_ctx=2048, answer_tokens=100)
    loaded = load(flags, engine=engine_that_runs_out_of_memory_once)
    try:
        first, retry = asked
        assert retry.n_ctx is None and retry.n_gpu_layers is None
        assert (retry.swa_full, retry.kv_type, retry.answer_tokens) == (True, "f16", 100)
        assert first.blocks is not None and retry.blocks is not None  # mtmd's counts, both times
        assert loaded.plan.swa_full
    finally:
        loaded.engine.close()


def test_when_the_retry_fails_too_the_message_has_the_numbers(test_models: dict[str, Path]) -> None:
    def never(config, **kwargs):  # noqa: ANN001, ANN202
        raise EngineError("out of memory")

    with pytest.raises(EngineError, match=r"needed \d+\.\d\d GiB of the 2\.00 GiB free"):
        load(_flags(test_models, vram=(2 * 2**30,)), engine=never)


def test_unsupported_architecture_is_named_before_loading(tmp_path: Path,
                                                          test_models: dict[str, Path]) -> None:
    import gguf

    path = tmp_path / "bert.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match="architecture 'bert' is not supported"):
        load(ModelFlags(str(path), str(test_models["mmproj_112"])))
