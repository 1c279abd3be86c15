"""The memory planner: formulas, decisions, and accuracy against llama.cpp's own reports."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from edgevlm.families import read_projector
from edgevlm.families.llava15 import clip_compute_bytes
from edgevlm.llama.engine import Engine
from edgevlm.llama.types import EngineConfig
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts, read_text_model
from edgevlm.planning.arithmetic import (
    compute_bytes,
    estimate,
    kv_bytes,
    kv_bytes_per_layer,
    weights_on_gpu,
    weights_on_host,
)
from edgevlm.planning.media_costs import ubatch_for
from edgevlm.planning.planner import choose as _choose
from edgevlm.planning.values import GIB, MIB, Allocation, MachineMemory, Plan, Settings
from edgevlm.planning.verify import compare
from edgevlm.runtime.loading import KEEPS
from edgevlm.store.prefix_cache import RAM_BYTES as PREFIX_RAM_BYTES

from ..conftest import load_script, run_cli


def choose(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
           settings: Settings | None = None) -> Plan:
    """The planner as the composition root calls it: handed what the chat and caches keep."""
    return _choose(text, projector, device, dataclasses.replace(settings or Settings(), keeps=KEEPS))

_writers = load_script("make_test_models")
LLAVA_7B, LLAVA_7B_GQA = _writers.LLAVA_7B, _writers.LLAVA_7B_GQA
write_sparse_llama = _writers.write_sparse_llama
write_sparse_vit_projector = _writers.write_sparse_vit_projector


def _facts(**changes: object) -> TextModelFacts:
    base = TextModelFacts(
        path=Path("x.gguf"), architecture="llama", name="x", n_layer=32, n_embd=4096, n_head=32,
        n_head_kv=32, head_dim_k=128, head_dim_v=128, n_ff=11008, n_ctx_train=4096, n_vocab=32000,
        chat_template=None, layer_bytes=tuple([100 * MIB] * 32), output_bytes=80 * MIB,
        token_embd_bytes=70 * MIB, file_bytes=0)
    return dataclasses.replace(base, **changes)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sparse GGUFs with LLaVA-1.5-7B's exact tensor shapes and types: 4 GB that cost no disk."""
    folder = tmp_path_factory.mktemp("shapes")
    return {
        "mha": write_sparse_llama(folder / "llava7b.gguf", LLAVA_7B),
        "gqa": write_sparse_llama(folder / "llava7b-gqa.gguf", LLAVA_7B_GQA),
        "mmproj": write_sparse_vit_projector(folder / "mmproj.gguf"),
    }


# -- formulas ------------------------------------------------------------------------------


def test_kv_uses_kv_heads_not_attention_heads() -> None:
    llama3 = _facts(n_head_kv=8, n_ctx_train=8192)
    assert kv_bytes(llama3, 8000) / GIB == pytest.approx(0.9766, abs=1e-3)
    assert kv_bytes(_facts(), 8000) / GIB == pytest.approx(3.906, abs=1e-3)  # the MHA mistake


def test_kv_types_use_ggml_block_sizes() -> None:
    f16 = kv_bytes(_facts(), 4096)
    assert f16 == 2 * 32 * 32 * 128 * 4096 * 2 == 2 * GIB
    assert kv_bytes(_facts(), 4096, "q8_0", "q8_0") == f16 * 34 // 64
    assert kv_bytes(_facts(), 4096, "q4_0", "q4_0") == f16 * 18 // 64
    assert kv_bytes(_facts(), 2048) * 2 == f16  # linear in n_ctx


def test_output_layer_goes_first_and_token_embd_never() -> None:
    facts = _facts()
    assert weights_on_gpu(facts, 0) == 0
    assert weights_on_gpu(facts, 1) == 80 * MIB  # the output layer alone
    assert weights_on_gpu(facts, 2) == 180 * MIB
    assert weights_on_gpu(facts, 33) == weights_on_gpu(facts, 99) == 80 * MIB + 32 * 100 * MIB
    assert weights_on_host(facts, 33) == 70 * MIB  # token_embd stays home


def test_compute_buffer_reference_points() -> None:
    facts = _facts()
    # llama.cpp on CUDA, 7B llama, n_ubatch 512, no flash attention: 296 and 164 MiB.
    assert compute_bytes(facts, 4096, flash_attn=False) / MIB == pytest.approx(296, rel=0.02)
    assert compute_bytes(facts, 2048, flash_attn=False) / MIB == pytest.approx(164, rel=0.02)
    with_fa = compute_bytes(facts, 4096, flash_attn=True)
    assert with_fa < compute_bytes(facts, 4096, flash_attn=False) / 2  # cut several-fold


def test_llava_7b_full_offload_total(shapes: dict[str, Path]) -> None:
    text, projector = read_text_model(shapes["mha"]), read_projector(shapes["mmproj"])
    b = estimate(text, projector, Allocation(n_ctx=4096, n_gpu_layers=33, flash_attn=False), margin_bytes=0)
    assert b.weights_gpu / GIB == pytest.approx(3.73, abs=0.01)
    assert b.kv_gpu == 2 * GIB
    assert b.mmproj / MIB == pytest.approx(595.5, abs=0.5)
    # 3.73 weights + 2.00 KV + 0.29 compute + 0.58 projector + 0.03 CLIP + 0.45 CUDA context
    assert 7.0 <= b.total_gpu / GIB <= 7.3


def test_clip_compute_for_vit_l(shapes: dict[str, Path]) -> None:
    projector = read_projector(shapes["mmproj"])
    assert 20 * MIB < clip_compute_bytes(projector, flash_attn=True) < 34 * MIB
    assert 20 * MIB < clip_compute_bytes(projector, flash_attn=False) < 34 * MIB


# -- decisions -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llava(shapes: dict[str, Path]) -> tuple[TextModelFacts, ProjectorFacts]:
    return read_text_model(shapes["mha"]), read_projector(shapes["mmproj"])


@pytest.mark.parametrize("gib", [24, 12, 8])
def test_cards_of_8gb_and_up_get_everything(llava: tuple[TextModelFacts, ProjectorFacts], gib: int) -> None:
    plan = choose(*llava, MachineMemory(vram_free=int(gib * GIB * 0.94), ram_free=16 * GIB))
    assert plan.n_gpu_layers == plan.n_layers == 33
    assert plan.n_ctx == 4096 and plan.mmproj_on_gpu
    assert plan.breakdown.total_gpu <= plan.vram_free
    assert plan.max_tiles >= 4


def test_6gb_and_4gb_cards_give_up_layers_last(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    six = choose(*llava, MachineMemory(vram_free=int(5.6 * GIB), ram_free=16 * GIB))
    four = choose(*llava, MachineMemory(vram_free=int(3.6 * GIB), ram_free=16 * GIB))
    assert 0 < four.n_gpu_layers < six.n_gpu_layers < 33
    assert six.type_k == "q8_0" and six.flash_attn  # KV shrunk before layers were given up
    for plan in (six, four):
        assert plan.breakdown.total_gpu <= plan.vram_free
        assert plan.n_ctx >= 2048 and plan.max_tiles >= 2


def test_no_gpu_is_a_cpu_plan(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    plan = choose(*llava, MachineMemory(vram_free=None, ram_free=16 * GIB))
    assert plan.device == "cpu" and plan.n_gpu_layers == 0 and not plan.mmproj_on_gpu
    assert plan.breakdown.total_gpu == 0 and plan.n_ctx == 4096
    assert any("repack" in note for note in plan.notes)


def test_a_cpu_plan_that_does_not_fit_names_what_does_not(
        llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    """Issue 39.16: a huge --n-ctx overflows with its KV cache, not with the weights (which mmap)."""
    huge = choose(*llava, MachineMemory(vram_free=None, ram_free=8 * GIB), Settings(n_ctx=32768))
    assert any("KV cache for n_ctx 32768" in note and "--n-ctx" in note for note in huge.notes)
    assert not any("page from disk" in note for note in huge.notes)
    small_ram = choose(*llava, MachineMemory(vram_free=None, ram_free=2 * GIB), Settings(n_ctx=2048))
    assert any("weights will page from disk" in note for note in small_ram.notes)


def test_more_vram_never_means_less(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    previous_layers, previous_ctx = 0, 0
    for mib in range(1024, 26 * 1024, 64):
        plan = choose(*llava, MachineMemory(vram_free=mib * MIB, ram_free=16 * GIB))
        layers = plan.n_gpu_layers if plan.device == "cuda" else 0
        assert layers >= previous_layers, f"{mib} MiB: {layers} layers after {previous_layers}"
        assert plan.n_ctx >= previous_ctx, f"{mib} MiB: n_ctx {plan.n_ctx} after {previous_ctx}"
        assert plan.breakdown.total_gpu <= mib * MIB
        previous_layers, previous_ctx = layers, plan.n_ctx


def test_full_offload_wherever_it_fits(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    text, projector = llava
    allocation = Allocation(n_ctx=2560, n_gpu_layers=33, type_k="q8_0", type_v="q8_0", flash_attn=True,
                            n_ubatch=ubatch_for(projector))
    smallest_full = estimate(text, projector, allocation).total_gpu
    plan = choose(text, projector, MachineMemory(vram_free=smallest_full, ram_free=16 * GIB))
    assert plan.n_gpu_layers == 33


def test_explicit_settings_are_honoured(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    plan = choose(*llava, MachineMemory(vram_free=24 * GIB, ram_free=16 * GIB),
                  Settings(n_ctx=2048, n_gpu_layers=20, kv_type="q4_0"))
    assert (plan.n_ctx, plan.n_gpu_layers, plan.type_k) == (2048, 20, "q4_0")
    assert plan.flash_attn  # a quantized V cache needs it


# -- accuracy against llama.cpp itself -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "flash_attn"), [("mha", False), ("gqa", True)])
def test_estimate_matches_llama_cpp(shapes: dict[str, Path], variant: str, flash_attn: bool) -> None:
    text, projector = read_text_model(shapes[variant]), read_projector(shapes["mmproj"])
    plan = choose(text, projector, MachineMemory(vram_free=None, ram_free=64 * GIB),
                  Settings(n_ctx=4096, flash_attn=flash_attn))
    assert plan.n_ubatch == 576  # one LLaVA view per ubatch
    config = EngineConfig(shapes[variant], shapes["mmproj"], n_ctx=plan.n_ctx, n_gpu_layers=0,
                          n_batch=plan.n_ubatch, n_ubatch=plan.n_ubatch, flash_attn=plan.flash_attn,
                          type_k=plan.type_k, type_v=plan.type_v,
                          mmproj_on_gpu=False, repack=False)
    with Engine(config) as engine:
        checks = {c.component: c for c in compare(plan, engine.reported_buffers)}
    assert set(checks) == {"weights", "kv", "compute", "mmproj", "mmproj_compute"}
    for name in ("weights", "kv", "mmproj"):
        assert abs(checks[name].error) <= 0.01, checks[name]
    for name in ("compute", "mmproj_compute"):
        assert abs(checks[name].error) <= 0.10, checks[name]


@pytest.mark.parametrize("mmproj", ["mmproj_336", "mmproj_112"])
@pytest.mark.parametrize("flash_attn", [True, False])
def test_estimate_matches_llama_cpp_on_a_tied_small_model(test_models: dict[str, Path], mmproj: str,
                                                         flash_attn: bool) -> None:
    """SmolLM ties its embeddings, like Qwen and Gemma: weights must not count token_embd twice."""
    text, projector = read_text_model(test_models["text"]), read_projector(test_models[mmproj])
    assert text.tied_embeddings
    plan = choose(text, projector, MachineMemory(vram_free=None, ram_free=16 * GIB),
                  Settings(n_ctx=2048, flash_attn=flash_attn))
    with Engine(EngineConfig(test_models["text"], test_models[mmproj], n_ctx=2048, n_gpu_layers=0,
                             n_batch=plan.n_ubatch, n_ubatch=plan.n_ubatch, flash_attn=flash_attn)) as engine:
        checks = {c.component: c for c in compare(plan, engine.reported_buffers)}
    for name in ("weights", "kv", "mmproj"):
        assert abs(checks[name].error) <= 0.01, checks[name]
    for name in ("compute", "mmproj_compute"):
        assert abs(checks[name].error) <= 0.10, checks[name]


def test_a_tied_output_layer_is_copied_only_to_the_gpu() -> None:
    tied = _facts(tied_embeddings=True, output_bytes=1 * MIB)
    assert weights_on_gpu(tied, 0) == 0
    assert weights_on_gpu(tied, 1) == tied.token_embd_bytes + 1 * MIB  # the copy, on the GPU
    assert weights_on_host(tied, 1) == tied.weight_bytes - 1 * MIB  # token_embd stays on the host
    assert weights_on_host(tied, 0) == tied.weight_bytes  # on the CPU the mapped tensor is reused


def test_plan_cli_json_and_verify(shapes: dict[str, Path]) -> None:
    args = ["plan", "--model", str(shapes["mha"]), "--mmproj", str(shapes["mmproj"])]
    result = run_cli(*args, "--vram", "12GiB", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["n_gpu_layers"] == data["n_layers"] == 33 and data["vram_free"] == 12 * GIB
    for key in ("weights_gpu", "weights_host", "kv", "compute", "mmproj", "mmproj_compute",
                "overhead", "margin", "total_gpu"):
        assert isinstance(data["bytes"][key], int)
    human = run_cli(*args, "--vram", "8G")
    assert human.returncode == 0 and "n_gpu_layers 33/33" in human.stdout and "total" in human.stdout
    bad = run_cli(*args, "--vram", "lots")
    assert bad.returncode == 2 and "not a size" in bad.stderr and "Traceback" not in bad.stderr


def test_one_image_view_per_ubatch(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    text, projector = llava
    plan = choose(text, projector, MachineMemory(vram_free=12 * GIB, ram_free=16 * GIB))
    assert plan.n_ubatch == ubatch_for(projector) == 576  # not 512 + 64
    at_512 = estimate(text, projector, Allocation(n_ctx=plan.n_ctx, n_gpu_layers=33, n_ubatch=512))
    assert plan.breakdown.compute_gpu > at_512.compute_gpu  # the planner pays for the bigger graph
    # n_ctx 4096: 4 full tiles beside the global view, labels and a 512-token answer (not 5,
    # which a flat text reserve without labels claimed); a 4K photo gets 5x3 pooled.
    assert plan.max_tiles == 4 and plan.max_pooled_tiles == 15
    assert (plan.photo_grid, plan.photo_pool) == ((5, 3), 2)
    assert plan.to_json()["n_ubatch"] == 576
    explicit = choose(text, projector, MachineMemory(vram_free=12 * GIB, ram_free=16 * GIB),
                      Settings(n_ubatch=256))
    assert explicit.n_ubatch == 256


def test_plan_reads_whole_when_piped_and_refuses_to_verify_a_gpu_plan_on_a_cpu_build(
        test_models: dict[str, Path]) -> None:
    from edgevlm.llama.backends import gpu_offload_supported

    args = ["plan", "--model", str(test_models["text"]), "--mmproj", str(test_models["mmproj_336"])]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    summary = next(line for line in result.stdout.splitlines() if "n_gpu_layers" in line)
    assert "a 3840x2160 photo:" in summary and len(summary) > 80  # one line, not wrapped at 80
    if not gpu_offload_supported():
        refused = run_cli(*args, "--vram", "8GiB", "--verify")
        assert refused.returncode == 2 and "cannot check a GPU plan" in refused.stderr


# -- parallel sequences -----------------------------------------------------------------------


def test_parallel_counts_kv_per_sequence(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    device = MachineMemory(vram_free=int(22 * GIB), ram_free=16 * GIB)
    one = choose(*llava, device, Settings(n_ctx=4096))
    four = choose(*llava, device, Settings(n_ctx=4096, n_seq=4))
    assert four.n_seq == 4 and four.n_ctx == one.n_ctx == 4096
    assert four.breakdown.kv_gpu == 4 * one.breakdown.kv_gpu
    assert four.breakdown.compute_gpu >= one.breakdown.compute_gpu
    assert four.breakdown.total_gpu <= four.vram_free


def test_parallel_auto_on_gpus_and_the_cpu(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    big = choose(*llava, MachineMemory(vram_free=int(22 * GIB), ram_free=16 * GIB), Settings(n_seq=None))
    assert big.n_seq == 4 and big.n_gpu_layers == big.n_layers and big.breakdown.total_gpu <= big.vram_free
    assert any("--parallel 4" in note for note in big.notes)
    small = choose(*llava, MachineMemory(vram_free=int(7.5 * GIB), ram_free=16 * GIB), Settings(n_seq=None))
    assert small.n_seq < 4 and small.breakdown.total_gpu <= small.vram_free  # 8 GB: fewer, or one
    cpu = choose(*llava, MachineMemory(vram_free=None, ram_free=16 * GIB), Settings(n_seq=None))
    assert cpu.n_seq == 1  # measured: no gain on the CPU (docs/parallel.md)


def test_parallel_estimate_matches_llama_cpp(test_models: dict[str, Path]) -> None:
    text, projector = read_text_model(test_models["text"]), read_projector(test_models["mmproj_112"])
    plan = choose(text, projector, MachineMemory(vram_free=None, ram_free=16 * GIB),
                  Settings(n_ctx=1024, flash_attn=True, n_seq=4))
    with Engine(EngineConfig(test_models["text"], test_models["mmproj_112"], n_ctx=1024, n_gpu_layers=0,
                             n_batch=plan.n_ubatch, n_ubatch=plan.n_ubatch, flash_attn=True,
                             n_seq=4)) as engine:
        checks = {c.component: c for c in compare(plan, engine.reported_buffers)}
    assert abs(checks["kv"].error) <= 0.01, checks["kv"]
    assert abs(checks["compute"].error) <= 0.10, checks["compute"]


def test_the_prefix_cache_is_counted_in_ram(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    roomy = choose(*llava, MachineMemory(vram_free=None, ram_free=16 * GIB))
    # A 4K photo's prefix for a 7B at f16 KV: 0.5 MiB of KV a position, and its rows.
    per_position = kv_bytes(llava[0], 1) + llava[0].n_embd * 4
    assert roomy.photo_prefix_bytes > 1000 * per_position
    assert roomy.prefix_ram_bytes == PREFIX_RAM_BYTES
    assert roomy.photo_prefixes_in_ram == PREFIX_RAM_BYTES // roomy.photo_prefix_bytes >= 1
    assert roomy.to_json()["prefix_cache"]["photo_prefixes_in_ram"] == roomy.photo_prefixes_in_ram
    tight = choose(*llava, MachineMemory(vram_free=None, ram_free=roomy.breakdown.total_host + GIB))
    assert 0 <= tight.prefix_ram_bytes < GIB  # only what the model leaves free, less the margin


@pytest.mark.parametrize("family", ["qwen", "gemma", "smolvlm", "lfm2", "gemma4", "qwen3"])
@pytest.mark.parametrize("flash_attn", [True, False])
def test_the_estimate_holds_for_every_family(test_models: dict[str, Path], family: str,
                                            flash_attn: bool) -> None:
    """mtmd families: the projector's compute reserved at mtmd's warmup size (Qwen2.5-VL's
    windowed attention: a patch-by-patch mask over 8464 patches) within 10 %; the hybrid LFM2's KV
    on its attention layers only; Gemma 4's on its three layers with a cache of their own, heads
    of 16 in the window and 32 outside it, at the ubatch its largest image needs (1120 rows
    attended both ways); Qwen3-VL's (learned positions, a deepstack merger, no window); the rest
    as ever."""
    text_path, mmproj_path = test_models[f"{family}_text"], test_models[f"{family}_mmproj"]
    text, projector = read_text_model(text_path), read_projector(mmproj_path)
    plan = choose(text, projector, MachineMemory(vram_free=None, ram_free=16 * GIB),
                  Settings(n_ctx=2048, flash_attn=flash_attn))
    with Engine(EngineConfig(text_path, mmproj_path, n_ctx=2048, n_gpu_layers=0, n_batch=plan.n_ubatch,
                             n_ubatch=plan.n_ubatch, flash_attn=flash_attn)) as engine:
        checks = {c.component: c for c in compare(plan, engine.reported_buffers)}
    for name in ("weights", "kv", "mmproj"):  # 1 %, or a few KiB of alignment on a 0.1 MB projector
        check = checks[name]
        assert abs(check.error) <= 0.01 or abs(check.estimated - check.reported) < 8192, check
    for name in ("compute", "mmproj_compute"):
        assert abs(checks[name].error) <= 0.10, checks[name]
    if family == "qwen":
        assert checks["mmproj_compute"].reported > 400 * 2**20  # the mask is real and counted
    if family == "gemma4":
        assert plan.n_ubatch == 1120


def test_gemma4s_window_estimate_matches_llama_cpp(test_models: dict[str, Path]) -> None:
    """The test Gemma 4 without swa_full: window layers at the window and a ubatch (padded), global
    ones at n_ctx, the shared layers at nothing; the KV llama.cpp allocates, within 1 %."""
    text_path, mmproj_path = test_models["gemma4_text"], test_models["gemma4_mmproj"]
    text, projector = read_text_model(text_path), read_projector(mmproj_path)
    assert (text.n_swa, text.n_swa_layers, text.kv_layers, text.n_shared_kv_layers) == (64, 2, 3, 2)
    plan = choose(text, projector, MachineMemory(vram_free=None, ram_free=16 * GIB),
                  Settings(n_ctx=8192, swa_full=False))
    with Engine(EngineConfig(text_path, mmproj_path, n_ctx=8192, n_gpu_layers=0, n_batch=plan.n_ubatch,
                             n_ubatch=plan.n_ubatch, swa_full=False)) as engine:
        checks = {c.component: c for c in compare(plan, engine.reported_buffers)}
    assert abs(checks["kv"].error) <= 0.01, checks["kv"]
    # one global layer of 2 x 32-wide heads at 8192 cells; two window layers of 16-wide ones at 1280
    expected = 8192 * 2 * 64 * 2 + 2 * 1280 * 2 * 32 * 2
    assert abs(plan.breakdown.kv_host - expected) <= text.n_layer  # averaged per layer, rounded down


# -- sliding-window models: the whole window cache, or a window's worth and checkpoints ------


def _gemma3_4b(gemma_text: Path) -> TextModelFacts:
    """Gemma 3 4B's shape (34 layers, a window of 1024 on 29 of them), on the test pair's file."""
    return dataclasses.replace(
        read_text_model(gemma_text), architecture="gemma3", n_layer=34, n_embd=2560, n_head=8,
        n_head_kv=4, head_dim_k=256, head_dim_v=256, n_ff=10240, n_ctx_train=131072, n_vocab=262144,
        layer_bytes=tuple([58 * MIB] * 34), output_bytes=0, token_embd_bytes=525 * MIB,
        tied_embeddings=True, n_kv_layers=34, n_swa=1024, n_swa_layers=29)


def test_a_window_cache_is_counted_on_the_windowed_layers_only(test_models: dict[str, Path]) -> None:
    gemma = _gemma3_4b(test_models["gemma_text"])
    whole, window = (kv_bytes_per_layer(gemma, 32768, window_cells=cells) for cells in (None, 1536))
    # 5 global layers at 32768 cells and 29 windowed ones at 1536, 4 KiB a cell and layer.
    assert whole * 34 == 34 * 32768 * 4096
    assert window * 34 == pytest.approx((5 * 32768 + 29 * 1536) * 4096, rel=1e-6)
    assert gemma.memory.window_cells(32768, 512, swa_full=False) == 1536
    assert gemma.memory.window_cells(1024, 512, swa_full=False) == 1024
    assert gemma.memory.window_cells(32768, 512, swa_full=True) is None


def test_the_planner_keeps_the_window_whole_only_where_it_costs_nothing(test_models: dict[str, Path]) -> None:
    gemma, projector = _gemma3_4b(test_models["gemma_text"]), read_projector(test_models["gemma_mmproj"])
    card = MachineMemory(vram_free=8 * GIB, ram_free=32 * GIB)
    chosen = choose(gemma, projector, card)
    whole = choose(gemma, projector, card, Settings(swa_full=True))
    assert not chosen.swa_full and whole.swa_full and chosen.n_ctx > whole.n_ctx
    note = next(n for n in chosen.notes if "sliding window" in n)
    assert "checkpoints" in note and f"cut n_ctx from {chosen.n_ctx} to {whole.n_ctx}" in note
    assert 0 < chosen.breakdown.checkpoints <= 1.1 * GIB  # 8 of a 1024-cell window of 29 layers
    assert whole.breakdown.checkpoints == 0
    # Asked for a context both fit at: the whole cache, no checkpoints, and why.
    short = choose(gemma, projector, card, Settings(n_ctx=8192))
    assert short.swa_full and short.n_ctx == 8192 and short.breakdown.checkpoints == 0
    assert any("kept whole" in n and "costs no layers or context" in n for n in short.notes)
    cpu = choose(gemma, projector, MachineMemory(vram_free=None, ram_free=32 * GIB))
    assert cpu.swa_full and cpu.to_json()["swa_full"] is True


@pytest.mark.parametrize("gib", [4, 6, 8, 12, 16, 24])
def test_the_choice_never_costs_layers_or_context(test_models: dict[str, Path], gib: int) -> None:
    gemma, projector = _gemma3_4b(test_models["gemma_text"]), read_projector(test_models["gemma_mmproj"])
    card = MachineMemory(vram_free=gib * GIB, ram_free=32 * GIB)
    chosen, window = choose(gemma, projector, card), choose(gemma, projector, card, Settings(swa_full=False))
    assert (chosen.n_gpu_layers, chosen.n_ctx, chosen.type_k) == (window.n_gpu_layers, window.n_ctx,
                                                                 window.type_k)


def test_the_window_estimate_matches_llama_cpp(test_models: dict[str, Path]) -> None:
    """The test Gemma (a window of 64 on layer 0 of 2) planned without swa_full: the KV llama.cpp
    allocates, and `plan --verify --no-swa-full` says the same."""
    text_path, mmproj_path = test_models["gemma_text"], test_models["gemma_mmproj"]
    text, projector = read_text_model(text_path), read_projector(mmproj_path)
    assert (text.n_swa, text.n_swa_layers, text.n_layer) == (64, 1, 2)
    plan = choose(text, projector, MachineMemory(vram_free=None, ram_free=16 * GIB),
                  Settings(n_ctx=4096, swa_full=False))
    with Engine(EngineConfig(text_path, mmproj_path, n_ctx=4096, n_gpu_layers=0, n_batch=plan.n_ubatch,
                             n_ubatch=plan.n_ubatch, swa_full=plan.swa_full)) as engine:
        assert not engine.swa_full and not engine.memory.can_cut(swa_full=engine.swa_full)
        checks = {c.component: c for c in compare(plan, engine.reported_buffers)}
    assert abs(checks["kv"].error) <= 0.01, checks["kv"]
    whole = choose(text, projector, MachineMemory(vram_free=None, ram_free=16 * GIB),
                   Settings(n_ctx=4096, swa_full=True))
    assert plan.breakdown.kv_host < whole.breakdown.kv_host
    verified = run_cli("plan", "--model", str(text_path), "--mmproj", str(mmproj_path), "--n-ctx", "4096",
                       "--no-swa-full", "--verify", "--json")
    assert verified.returncode == 0, verified.stderr
    data = json.loads(verified.stdout)
    assert data["swa_full"] is False and any("--no-swa-full" in n for n in data["notes"])
    kv = next(c for c in data["verify"] if c["component"] == "kv")
    assert abs(kv["estimated"] - kv["reported"]) <= 0.01 * kv["reported"]


def test_swa_settings_on_a_model_without_a_window_say_they_change_nothing(
        llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    machine = MachineMemory(vram_free=8 * GIB, ram_free=16 * GIB)
    plain, asked = choose(*llava, machine), choose(*llava, machine, Settings(swa_full=False))
    assert (asked.n_ctx, asked.n_gpu_layers, asked.swa_full) == (plain.n_ctx, plain.n_gpu_layers, False)
    assert asked.notes[-1] == "--no-swa-full changes nothing: this model has no sliding-window cache"


def test_a_minute_of_video_is_planned_in_the_familys_blocks(test_models: dict[str, Path]) -> None:
    """Qwen-VL samples 2 frames a second and shows two in one block (a merged temporal patch):
    `plan` counts its minute as 120 frames in windows of 16, each window 8 blocks of one frame's
    tokens; Gemma 3 shows each frame alone, at 1 fps."""
    from ..conftest import invoke_cli

    found = {}
    pairs = (("qwen", "qwen_text", "qwen_mmproj"), ("gemma", "gemma_text", "gemma_mmproj"),
             ("llava", "text", "mmproj_336"))
    for family, text, mmproj in pairs:
        result = invoke_cli("plan", "--model", str(test_models[text]), "--mmproj", str(test_models[mmproj]),
                            "--n-ctx", "8192", "--json")
        assert result.returncode == 0, result.stderr
        found[family] = json.loads(result.stdout)["video_minute"]
    qwen, gemma, llava = found["qwen"], found["gemma"], found["llava"]
    # LLaVA's windows are describe's: 8 s each, showing those of their 8 frames that fit the room
    # (the plan said 20 windows of 3 frames where describe read 8 s windows, issue 49.17).
    assert (llava["windows"], llava["window_s"], llava["read_frames"]) == (8, 8.0, 8)
    assert 1 <= llava["window_frames"] < 8
    assert (qwen["fps"], qwen["frames"], qwen["window_frames"], qwen["windows"]) == (2.0, 120, 16, 8)
    assert qwen["frames_per_block"] == 2 and qwen["window_tokens"] == 8 * qwen["frame_tokens"] > 0
    assert (gemma["fps"], gemma["frames"], gemma["window_frames"]) == (1.0, 60, 8)
    assert gemma["frames_per_block"] == 1
    assert gemma["window_tokens"] == 8 * gemma["frame_tokens"] > 0
