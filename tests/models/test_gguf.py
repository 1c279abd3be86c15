"""GGUF facts from the generated test models, and the pairing checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from PIL import Image

from edgevlm.errors import ModelError
from edgevlm.families import check_pair, read_projector
from edgevlm.models.gguf import read_text_model

from ..conftest import load_script, run_cli


def test_text_model_facts(test_models: dict[str, Path]) -> None:
    facts = read_text_model(test_models["text"])
    assert (facts.architecture, facts.n_layer, facts.n_embd) == ("llama", 30, 576)
    assert (facts.n_head, facts.n_head_kv, facts.head_dim_k) == (9, 3, 64)  # GQA
    assert facts.n_ctx_train == 8192 and facts.n_vocab == 49152
    assert "<|im_start|>" in (facts.chat_template or "")
    assert len(facts.layer_bytes) == 30 and all(b == facts.layer_bytes[0] for b in facts.layer_bytes)
    # SmolLM2 ties its output to token_embd: the output layer carries a copy of it.
    # SmolLM ties its output layer to token_embd: the output layer's own bytes are its norm only.
    assert facts.tied_embeddings and 0 < facts.output_bytes < facts.token_embd_bytes
    assert facts.weight_bytes <= facts.file_bytes + facts.token_embd_bytes


def test_projector_facts(test_models: dict[str, Path]) -> None:
    big, small = read_projector(test_models["mmproj_336"]), read_projector(test_models["mmproj_112"])
    assert (big.image_size, big.patch_size, big.tokens_per_image) == (336, 14, 576)
    assert small.tokens_per_image == 64
    assert big.projection_dim == 576 and big.projector_type == "mlp"
    check_pair(read_text_model(test_models["text"]), big)


def test_swapped_files_are_named(test_models: dict[str, Path]) -> None:
    with pytest.raises(ModelError, match="pass it as --mmproj"):
        read_text_model(test_models["mmproj_336"])
    with pytest.raises(ModelError, match="pass it as --model"):
        read_projector(test_models["text"])


def test_width_mismatch_is_caught_before_loading(test_models: dict[str, Path], tmp_path: Path) -> None:
    writers = load_script("make_test_models")
    wide = writers.write_projector(tmp_path / "wide.gguf", image_size=112, text_width=640)
    with pytest.raises(ModelError, match="width 640 .* embedding width 576"):
        check_pair(read_text_model(test_models["text"]), read_projector(wide))


def test_a_qwen_pair_is_accepted_an_audio_projector_refused(test_models: dict[str, Path]) -> None:
    qwen = read_projector(test_models["qwen_mmproj"])
    assert qwen.projector_type == "qwen2.5vl_merger" and qwen.projection_dim == 64 and qwen.merge == 2
    text = read_text_model(test_models["qwen_text"])
    check_pair(text, qwen)  # no error: mtmd runs this family
    with pytest.raises(ModelError, match="projector type 'ultravox' takes no images"):
        check_pair(text, dataclasses.replace(qwen, projector_type="ultravox"))
    with pytest.raises(ModelError, match="projects to width 64 but"):
        check_pair(read_text_model(test_models["text"]), qwen)


def test_not_gguf_and_truncated(tmp_path: Path, test_models: dict[str, Path]) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match="not a GGUF"):
        read_text_model(junk)
    cut = tmp_path / "cut.gguf"
    with test_models["text"].open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(20_000_000))
    with pytest.raises(ModelError, match="truncated"):
        read_text_model(cut)
    with pytest.raises(ModelError, match="no such file"):
        read_text_model(tmp_path / "absent.gguf")


def test_pairs_of_different_families_are_refused_even_at_one_width(test_models: dict[str, Path]) -> None:
    """Issue 39.14: every tiny pair is 64 wide, as real pairs of different families can be;
    the family (text architecture and projector type) decides, before anything loads."""
    families = ("qwen", "gemma", "smolvlm", "lfm2")
    for text_family in families:
        text = read_text_model(test_models[f"{text_family}_text"])
        for projector_family in families:
            projector = read_projector(test_models[f"{projector_family}_mmproj"])
            if text_family == projector_family:
                check_pair(text, projector)
            else:
                with pytest.raises(ModelError, match="not a pair"):
                    check_pair(text, projector)


def test_a_mismatched_pair_is_one_line_before_loading(test_models: dict[str, Path], tmp_path: Path) -> None:
    photo = tmp_path / "p.jpg"
    Image.new("RGB", (64, 48)).save(photo)
    result = run_cli("describe", str(photo), "--model", str(test_models["qwen_text"]),
                     "--mmproj", str(test_models["gemma_mmproj"]), "--max-tokens", "2")
    assert result.returncode == 2 and "not a pair" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_converter_made_gemma4_projector_is_read_and_loaded_with_its_activation(
        test_models: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """llama.cpp's converter writes Gemma 4's projector type as clip.vision.projector_type (its
    files hold a vision and an audio encoder) and no clip.use_gelu: clip.cpp then runs GELU-quick
    where transformers runs GELU (tanh). The type is read where clip.cpp reads it, and the file is
    loaded as a copy that names its activation, made once, its tensors as they were."""
    import numpy as np
    from gguf import GGUFReader

    from edgevlm.families.gemma import GEMMA4
    from edgevlm.runtime.loading import ModelFlags, as_trained, inspect

    writers = load_script("make_test_models")
    converted = writers.write_gemma4_projector(tmp_path / "mmproj-gemma4.gguf", as_converted=True)
    facts = read_projector(converted)
    assert (facts.projector_type, facts.activation) == ("gemma4v", "")
    assert GEMMA4.repair(facts).flags == ("clip.use_gelu",)
    assert not GEMMA4.repair(read_projector(test_models["gemma4_mmproj"]))  # it names gelu
    with caplog.at_level("WARNING", logger="edgevlm"):
        flags = ModelFlags(model=str(test_models["gemma4_text"]), mmproj=str(converted))
        choice, _, projector = inspect(flags)
    assert "names no clip.use_gelu" in caplog.text and choice.mmproj_path == projector.path != converted
    assert (projector.projector_type, projector.activation) == ("gemma4v", "gelu")
    assert dataclasses.replace(projector, path=facts.path, activation="",
                               file_bytes=facts.file_bytes) == facts  # the same but the flag
    source, copy = GGUFReader(converted), GGUFReader(projector.path)
    assert [t.name for t in copy.tensors] == [t.name for t in source.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(source.tensors, copy.tensors, strict=True))
    caplog.clear()
    with caplog.at_level("WARNING", logger="edgevlm"):
        assert as_trained(facts).path == projector.path  # made once
    assert caplog.text == ""
    # keyed as before repairs were values (the flags alone): a copy made then is found again
    import hashlib

    from edgevlm.store.caches import file_identity

    source_path = converted.resolve()
    old_key = hashlib.sha256(f"{source_path.parent}|{file_identity(source_path)}|{('clip.use_gelu',)}"
                             .encode()).hexdigest()[:16]
    assert projector.path.name == f"{converted.stem}.{old_key}.gguf"


def test_a_projector_copy_that_cannot_be_written_leaves_the_file_as_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A full disk or a read-only cache is a warning, not a failed load: the file as converted
    still runs (with clip.cpp's default activation)."""
    from edgevlm.runtime.loading import as_trained

    writers = load_script("make_test_models")
    written = writers.write_gemma4_projector(tmp_path / "mmproj-gemma4.gguf", as_converted=True)
    converted = read_projector(written)
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    with caplog.at_level("WARNING", logger="edgevlm"):
        assert as_trained(converted) == converted
    assert "could not write" in caplog.text and "as it is" in caplog.text


def test_a_llava_projector_is_loaded_with_its_position_rows_rolled(
        test_models: dict[str, Path], caplog: pytest.LogCaptureFixture, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """LLaVA's CLIP towers on the pinned llama.cpp (its graph puts the class token last, llama.cpp
    #25814, and runs one stored block fewer where the file names no feature layer, #25817): the
    file is loaded as a copy whose position rows are rolled by one, first to last, with its last
    stored block named as the feature layer, every other tensor and key as it was, marked so that
    its layout puts the rows back in patch order and so that it is never repaired twice; made
    once, and said at info level (no warning: the legacy converter writes every LLaVA so)."""
    import numpy as np
    from gguf import GGUFReader

    from edgevlm.families import family_for, layout_for
    from edgevlm.families.llava15 import LabelledTiles
    from edgevlm.models.gguf import POSITION_TENSOR
    from edgevlm.runtime.loading import as_trained

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a cache of its own: the copy made here
    source = read_projector(test_models["mmproj_112"])
    assert source.class_token and not source.positions_rolled and source.feature_layers == ()
    repair = family_for(source).repair(source)
    assert repair.roll_positions and repair.feature_layer == source.vision_blocks > 0
    with caplog.at_level("INFO", logger="edgevlm"):
        copy = as_trained(source)
    assert "#25814" in caplog.text and "#25817" in caplog.text and "WARNING" not in caplog.text
    assert copy.path != source.path and copy.positions_rolled and not family_for(copy).repair(copy)
    assert copy.feature_layers == (source.vision_blocks,)
    assert dataclasses.replace(copy, path=source.path, positions_rolled=False, feature_layers=(),
                               file_bytes=source.file_bytes) == source
    rolled, as_is = layout_for(copy), layout_for(source)
    assert isinstance(rolled, LabelledTiles) and isinstance(as_is, LabelledTiles)
    assert rolled.rolled and not as_is.rolled
    theirs, ours = GGUFReader(source.path), GGUFReader(copy.path)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for before, after in zip(theirs.tensors, ours.tensors, strict=True):
        expected = np.roll(before.data, -1, axis=0) if before.name == POSITION_TENSOR else before.data
        assert np.array_equal(after.data, expected), before.name
    caplog.clear()
    with caplog.at_level("INFO", logger="edgevlm"):
        assert as_trained(source).path == copy.path  # made once
    assert caplog.text == ""


def test_a_rolled_projectors_rows_go_back_in_patch_order() -> None:
    """The rolled tower hands on patches 1..N-1, then the class token: the class token's row goes,
    and patch 0's, which llama.cpp's graph never returns, is its right-hand neighbour's."""
    import numpy as np

    from edgevlm.families.llava15 import in_patch_order
    from edgevlm.values.embedding import ImageEmbedding

    rows = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)  # patches 1-4, then the class token
    restored = in_patch_order(ImageEmbedding(rows)).rows
    assert restored.shape == rows.shape
    assert np.array_equal(restored, rows[[0, 0, 1, 2, 3]])
