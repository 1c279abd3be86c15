"""The planner: pick n_gpu_layers, n_ctx, the KV type and the image budget that fit the machine,
from the estimate (arithmetic.py) and what images cost (media_costs.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgevlm.families import family_for
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts
from edgevlm.planning.arithmetic import (
    compute_bytes,
    estimate,
    kv_bytes_per_layer,
    prefix_bytes,
    windowed_cells,
)
from edgevlm.planning.media_costs import (
    estimated_costs,
    min_ctx_for_images,
    tiles_at,
    ubatch_for,
)
from edgevlm.planning.split import LayerCosts, place
from edgevlm.planning.values import (
    AUTO,
    CPU_AUTO_CTX_CAP,
    CTX_STEP,
    MAX_AUTO_PARALLEL,
    PARALLEL_CTX,
    Allocation,
    Breakdown,
    MachineMemory,
    Plan,
    Settings,
    format_bytes,
)


def swa_note(text: TextModelFacts, plan: Plan, other: Plan | None) -> str:
    """Why a sliding-window model's plan keeps its window cache whole or not, and at what cost
    (`other`: the plan the other way, where the planner weighed both)."""
    head = text.memory.note()
    b = plan.breakdown
    if plan.swa_full:
        why = "it costs no layers or context here" if other else "asked for with --swa-full"
        extra = f", {format_bytes(b.kv - other.breakdown.kv)} more KV than a window's" if other else ""
        return (f"{head}, its cache kept whole (llama.cpp's swa_full; {why}{extra}): the summary swap "
                "and rewinds cut it exactly, with no checkpoints")
    why = "asked for with --no-swa-full" if other is None else f"swa_full would {_what_it_costs(plan, other)}"
    return (f"{head}, a window's worth cached ({why}): the summary swap goes back through checkpoints "
            f"of the window, {format_bytes(b.checkpoints)} of RAM at most, and re-decodes only the text "
            "after them")


def _what_it_costs(window: Plan, whole: Plan) -> str:
    """What keeping the window cache whole would have given up, in the planner's words."""
    if whole.n_seq < window.n_seq:
        return f"decode {whole.n_seq} requests together, not {window.n_seq}"
    if whole.n_gpu_layers < window.n_gpu_layers:
        return f"leave {window.n_gpu_layers - whole.n_gpu_layers} more layers on the CPU"
    if whole.n_ctx < window.n_ctx:
        return f"cut n_ctx from {window.n_ctx} to {whole.n_ctx}"
    if whole.type_k != window.type_k:
        return f"need a {whole.type_k} KV cache"
    return f"not fit ({format_bytes(whole.breakdown.kv - window.breakdown.kv)} more KV)"


def _choose_swa_cache(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
                      settings: Settings) -> Plan:
    """A sliding-window model: its whole window cache (swa_full, cut anywhere) where that costs
    no sequences, layers, context or KV precision and still fits; else a window's worth, with
    checkpoints of it for the summary swap."""
    if settings.swa_full is not None:
        plan = _choose_plain(text, projector, device, settings)
        return replace(plan, notes=(*plan.notes, swa_note(text, plan, None)))
    whole = _choose_plain(text, projector, device, replace(settings, swa_full=True))
    window = _choose_plain(text, projector, device, replace(settings, swa_full=False))
    same = (whole.n_seq, whole.n_gpu_layers, whole.n_ctx, whole.type_k) == (
        window.n_seq, window.n_gpu_layers, window.n_ctx, window.type_k)
    fits = _Planner(text, projector, device, settings).fits(whole)
    chosen, other = (whole, window) if same and fits else (window, whole)
    return replace(chosen, notes=(*chosen.notes, swa_note(text, chosen, other)))


def choose(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
           settings: Settings = AUTO) -> Plan:
    """Pick n_gpu_layers, n_ctx and the KV type.

    Order of preference on a GPU: every layer on it at the largest context up to n_ctx_train
    (q8_0 KV only when it buys a larger context than f16); then fewer layers at the minimum
    image context; the projector leaves the GPU only when not even it fits (then the whole
    plan is a CPU plan). More VRAM never yields fewer layers or a smaller context.
    """
    if len(text.memory.cache_choices(None)) > 1:  # a window cache: kept whole, or a window's worth
        return _choose_swa_cache(text, projector, device, settings)
    plan = _choose_plain(text, projector, device, settings)
    kept = text.memory.note()
    notes = ((kept,) if kept else ()) + plan.notes
    if settings.swa_full is not None:
        flag = "--swa-full" if settings.swa_full else "--no-swa-full"
        notes += (f"{flag} changes nothing: this model has no sliding-window cache",)
    return replace(plan, notes=notes)


def _choose_plain(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
                  settings: Settings) -> Plan:
    """choose, with the sliding-window cache (if any) settled."""
    if settings.n_seq is None:
        return choose_parallel(text, projector, device, settings)
    planner = _Planner(text, projector, device, settings)
    if not device.is_gpu:
        return planner.cpu_plan(planner.ctx_cap, [])
    if settings.n_gpu_layers is not None:
        return planner.with_layers(settings.n_gpu_layers)
    return planner.full_offload() or planner.partial_offload()


def choose_parallel(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
                    settings: Settings) -> Plan:
    """--parallel auto: on a GPU, the most sequences (up to 4) that fit fully offloaded at
    n_ctx min(single plan's, PARALLEL_CTX) each; on the CPU, one (measured: decode is
    compute-bound there, so sequences decoded together cost nearly what they cost in turn).
    """
    single = _choose_plain(text, projector, device, replace(settings, n_seq=1))
    if not device.is_gpu or single.n_gpu_layers < single.n_layers or settings.n_gpu_layers is not None:
        return single
    ctx = min(single.n_ctx, settings.n_ctx or PARALLEL_CTX)
    for n_seq in range(MAX_AUTO_PARALLEL, 1, -1):
        planner = _Planner(text, projector, device, replace(settings, n_ctx=ctx, n_seq=n_seq))
        plan = planner.full_offload()
        if plan is not None:
            note = f"{n_seq} requests decode together (--parallel {n_seq}), n_ctx {ctx} each"
            return replace(plan, notes=(*plan.notes, note))
    return single


class _Planner:
    """The candidates `choose` weighs, built and checked one way."""

    def __init__(self, text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
                 settings: Settings) -> None:
        self.text, self.projector, self.device, self.settings = text, projector, device, settings
        self.n_layers = text.n_layer + 1
        self.ctx_cap = settings.n_ctx or text.n_ctx_train
        self.min_ctx = settings.n_ctx or min(
            min_ctx_for_images(projector, answer_tokens=settings.answer_tokens), self.ctx_cap)
        self.kv_choices = [settings.kv_type] if settings.kv_type else ["f16", "q8_0"]
        self.n_ubatch = settings.n_ubatch or ubatch_for(projector, text)
        self.costs = settings.costs or estimated_costs(projector)
        self.n_seq = settings.n_seq or 1
        # Only a sliding-window model has a choice (a hybrid with a window uses checkpoints anyway):
        # the whole window cache unless told otherwise (_choose_swa_cache weighs both).
        self.swa_full = text.memory.cache_choices(settings.swa_full)[0]

    def build(self, n_ctx: int, layers: int, kv: str, *, on_gpu: bool = True,
              notes: tuple[str, ...] = ()) -> Plan:
        """One candidate plan with its estimate."""
        s, gpu = self.settings, on_gpu and self.device.is_gpu
        fa = s.flash_attn or kv != "f16"  # a quantized V cache needs flash attention
        clip_on_gpu = on_gpu and self.projector_device() != "CPU"
        allocation = Allocation(n_ctx, layers, type_k=kv, type_v=kv, flash_attn=fa, mmproj_on_gpu=clip_on_gpu,
                                n_ubatch=self.n_ubatch, n_seq=self.n_seq, swa_full=self.swa_full)
        breakdown = estimate(self.text, self.projector, allocation, on_gpu=gpu,
                             overhead_bytes=s.overhead_bytes, margin_bytes=s.margin_bytes, keeps=s.keeps)
        tiles = tiles_at(self.costs, self.projector, n_ctx, s.answer_tokens, blocks=s.blocks,
                         images=s.images_per_turn)
        split = self.split(n_ctx, layers, kv, fa) if gpu and self.device.is_split else None
        return Plan(
            device=("split" if split else "cuda") if gpu else "cpu", n_gpu_layers=layers if on_gpu else 0,
            n_layers=self.n_layers,
            n_ctx=n_ctx, n_ctx_train=self.text.n_ctx_train, type_k=kv, type_v=kv, flash_attn=fa,
            mmproj_on_gpu=gpu and clip_on_gpu, vram_free=self.device.vram_free, ram_free=self.device.ram_free,
            breakdown=breakdown, notes=notes, n_ubatch=self.n_ubatch, max_tiles=tiles.max_tiles,
            max_pooled_tiles=tiles.max_pooled_tiles, photo_grid=tiles.photo_grid,
            photo_pool=tiles.photo_pool, tile_size=self.projector.image_size,
            layout=family_for(self.projector).layout(self.projector, s.blocks).name, n_seq=self.n_seq,
            memory=self.text.memory.name.value,
            photo_visual_tokens=tiles.photo_visual_tokens, photo_shown=tiles.photo_shown,
            photo_prefix_bytes=prefix_bytes(self.text, self.costs.system_tokens + tiles.photo_tokens, kv),
            prefix_ram_bytes=self._prefix_ram(breakdown), swa_full=self.swa_full,
            images_per_turn=s.images_per_turn, **(split or {}))

    def _prefix_ram(self, breakdown: Breakdown) -> int:
        """The prefix cache's RAM tier: its cap, or less where the model leaves less RAM free."""
        spare = self.device.ram_free - breakdown.total_host - self.settings.margin_bytes
        return max(0, min(self.settings.keeps.prefix_ram_bytes, spare))

    def projector_device(self) -> str | None:
        """--mmproj-device, or CPU when every device is an RPC worker (the projector stays on this
        machine unless told otherwise); None: the planner picks."""
        gpus = self.device.gpus
        if self.settings.mmproj_device is None and gpus and all(g.kind == "rpc" for g in gpus):
            return "CPU"
        return self.settings.mmproj_device

    def split(self, n_ctx: int, layers: int, kv: str, fa: bool) -> dict[str, Any]:
        """The per-device fields of a plan over several devices."""
        s, total_ctx = self.settings, n_ctx * self.n_seq
        costs = LayerCosts(
            kv_per_layer=kv_bytes_per_layer(self.text, total_ctx, kv, kv,
                                            window_cells=windowed_cells(self.text, n_ctx, self.n_ubatch,
                                                                         self.n_seq, swa_full=self.swa_full),
                                            flash_attn=fa),
            compute_layers=compute_bytes(self.text, total_ctx, n_ubatch=self.n_ubatch, flash_attn=fa,
                                         output_layer=False),
            compute_output=compute_bytes(self.text, total_ctx, n_ubatch=self.n_ubatch, flash_attn=fa),
            pipeline_inputs=min(self.n_ubatch, total_ctx) * (4 * self.text.n_embd + 2 * total_ctx),
            mmproj=self.projector.weight_bytes + family_for(self.projector).encoder_compute_bytes(
                self.projector, flash_attn=fa),
            driver_overhead=s.overhead_bytes, margin=s.margin_bytes)
        gpus, wanted = self.device.gpus, self.projector_device()
        local = [i for i, g in enumerate(gpus) if g.kind != "rpc"]
        if wanted == "CPU":  # on the host: no device holds it
            costs = replace(costs, mmproj=0)
        names = [g.name for g in gpus]
        shares, split, clip = place(self.text, gpus, layers, costs, weights=s.tensor_split,
                                    mmproj_device=names.index(wanted) if wanted in names else None,
                                    candidates=local)
        holder = "CPU" if wanted == "CPU" else gpus[clip].name
        return {"devices": shares, "tensor_split": split, "mmproj_device": holder}

    def fits(self, plan: Plan) -> bool:
        """Whether the plan fits where it runs: each device, the GPU, or on the CPU the free RAM."""
        if plan.device == "cpu":
            return plan.breakdown.total_host + self.settings.margin_bytes <= self.device.ram_free
        if plan.devices:
            return all(d.fits for d in plan.devices)
        vram = self.device.vram_free
        return vram is not None and plan.breakdown.total_gpu <= vram

    def largest_ctx(self, layers: int) -> Plan | None:
        """The largest context (either KV type; f16 wins ties) at which `layers` fit."""
        best: Plan | None = None
        for kv in self.kv_choices:
            for ctx in _ctx_candidates(self.ctx_cap, self.min_ctx):
                candidate = self.build(ctx, layers, kv)
                if self.fits(candidate):
                    if best is None or candidate.n_ctx > best.n_ctx:
                        best = candidate
                    break
        return best

    def with_layers(self, requested: int) -> Plan:
        """--n-gpu-layers given: the largest context that fits them."""
        layers = max(0, min(requested, self.n_layers))
        plan = self.largest_ctx(layers)
        if plan is not None:
            return plan
        note = "the requested --n-gpu-layers does not fit the free VRAM at the minimum context"
        return self.build(self.min_ctx, layers, self.kv_choices[-1], notes=(note,))

    def full_offload(self) -> Plan | None:
        """Every layer on the GPU, at the largest context either KV type allows."""
        plan = self.largest_ctx(self.n_layers)
        if plan is not None and plan.type_k != "f16":
            note = f"q8_0 KV cache (with flash attention) buys n_ctx {plan.n_ctx}"
            plan = replace(plan, notes=(note,))
        return plan

    def partial_offload(self) -> Plan:
        """Fewer layers at the minimum image context and the smallest KV; else the CPU."""
        kv = self.kv_choices[-1]
        for layers in range(self.n_layers - 1, 0, -1):
            candidate = self.build(self.min_ctx, layers, kv)
            if self.fits(candidate):
                note = (f"{self.n_layers - layers} of {self.n_layers} layers stay on the CPU: "
                        "the full model does not fit the free VRAM")
                return replace(candidate, notes=(note,))
        # The minimum context, so that a slightly bigger card (a few layers on it) never gets less.
        return self.cpu_plan(self.min_ctx, ["not even the projector fits the free VRAM: running on the CPU"])

    def cpu_plan(self, ctx_cap: int, notes: list[str]) -> Plan:
        """No GPU: the largest context up to the CPU cap that fits the free RAM."""
        s = self.settings
        if s.n_ctx is None and ctx_cap > max(CPU_AUTO_CTX_CAP, self.min_ctx):
            ctx_cap = max(CPU_AUTO_CTX_CAP, self.min_ctx)
            notes.append(f"n_ctx capped at {ctx_cap} on the CPU to keep prefill short; --n-ctx raises it")
        kv = s.kv_type or "f16"
        for ctx in _ctx_candidates(ctx_cap, self.min_ctx):
            plan = self.build(ctx, 0, kv, on_gpu=False)
            if self.fits(plan):
                break
        if not self.fits(plan):
            notes.append(self._ram_overflow_note(plan))
        notes.append("llama.cpp's CPU backend may repack quantized weights into an extra buffer "
                     "(faster matmuls); the file's own pages then become reclaimable cache")
        return replace(plan, notes=tuple(notes))


    def _ram_overflow_note(self, plan: Plan) -> str:
        """What does not fit the free RAM, named: the weights page from disk (mmap), but a KV
        cache that does not fit is memory the system must swap, and --n-ctx is the fix."""
        b = plan.breakdown
        without_kv = b.total_host - b.kv_host + self.settings.margin_bytes
        if without_kv <= self.device.ram_free:
            return (f"the KV cache for n_ctx {plan.n_ctx} ({format_bytes(b.kv_host)}) does not fit the "
                    f"free RAM ({format_bytes(self.device.ram_free)}) beside the model: lower --n-ctx "
                    "or use --kv-type q8_0")
        return "the model is larger than the free RAM: its weights will page from disk (slow)"


def _ctx_candidates(cap: int, floor: int) -> list[int]:
    """cap, then the multiples of CTX_STEP below it, down to floor (largest first)."""
    steps = range(cap // CTX_STEP * CTX_STEP, floor - 1, -CTX_STEP)
    return [cap] + [c for c in steps if floor <= c < cap]

