"""Option groups: options that travel together, declared once as frozen values.

A command takes a group as one parameter (`model: ModelOptions`, `devices: DeviceOptions`);
`@grouped` shows Typer the group's fields as the command's own options, in its place, and hands
the command the value made from them. A flag added to a group reaches every command that takes
it, with the same name, default and help (cli/options.py); the group turns itself into the core's
value (`DeviceOptions.placement`, `ModelOptions.flags`), so no command repeats that either.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from edgevlm.cli import options as opt
from edgevlm.errors import ConfigError
from edgevlm.models.catalog import DEFAULT_PRESET

if TYPE_CHECKING:  # loaded when a command runs, not for `--help`
    from edgevlm.describe.runs import Outputs
    from edgevlm.runtime.loading import ModelFlags, Placement

R = TypeVar("R")


@dataclass(frozen=True)
class DeviceOptions:
    """Where the layers and the vision projector run: RPC workers, the split between devices."""

    rpc: opt.Rpc = None
    tensor_split: opt.TensorSplit = None
    split_mode: opt.SplitMode = "layer"
    main_gpu: opt.MainGpu = 0
    mmproj_device: opt.MmprojDevice = None

    def placement(self) -> Placement:
        """The device flags, checked for shape (the devices themselves are checked at planning)."""
        from edgevlm.rpc.endpoints import parse_endpoints
        from edgevlm.runtime.loading import Placement

        weights = None
        if self.tensor_split is not None:
            try:
                weights = tuple(float(w) for w in self.tensor_split.split(","))
            except ValueError:
                raise ConfigError(f"--tensor-split {self.tensor_split}: expected numbers, e.g. 3,1") from None
            if any(w < 0 for w in weights) or not any(weights):
                raise ConfigError(f"--tensor-split {self.tensor_split}: the shares must be positive")
        return Placement(rpc=tuple(parse_endpoints(self.rpc)) if self.rpc else (), tensor_split=weights,
                         split_mode=self.split_mode, main_gpu=self.main_gpu, mmproj_device=self.mmproj_device)


@dataclass(frozen=True)
class ModelOptions:
    """Which model, and how it is loaded: the files, the context, the layers on the GPU, threads."""

    model: opt.Model = DEFAULT_PRESET
    mmproj: opt.Mmproj = None
    n_ctx: opt.NCtx = None
    n_gpu_layers: opt.NGpuLayers = None
    swa_full: opt.SwaFull = None
    threads: opt.Threads = None
    fetch_missing: opt.Fetch = False

    def flags(self, devices: DeviceOptions, *, answer_tokens: int, parallel: int | None = 1) -> ModelFlags:
        """The core's model flags: these, where they run, an answer's room and the sequences."""
        from edgevlm.runtime.loading import ModelFlags

        return ModelFlags(str(self.model), str(self.mmproj) if self.mmproj else None, self.n_ctx,
                          self.n_gpu_layers, self.threads, answer_tokens=answer_tokens,
                          fetch=self.fetch_missing, parallel=parallel, swa_full=self.swa_full,
                          placement=devices.placement())


@dataclass(frozen=True)
class ViewOptions:
    """How much of each image is shown: the tiles, their pooling, the task's detail (as typed:
    each is parsed where the command knows where it came from, flag or variable)."""

    tiles: opt.Tiles = "auto"
    pool: opt.Pool = "auto"
    detail: opt.Detail = "chat"


@dataclass(frozen=True)
class OutputOptions:
    """Where describe writes its answers beside printing them: caption files, JSONL, XMP."""

    write_captions: opt.WriteCaptions = False
    out_dir: opt.OutDir = None
    jsonl: opt.Jsonl = None
    write_xmp: opt.WriteXmp = False
    embed: opt.Embed = False
    xmp_name: opt.XmpName = "IMG.jpg.xmp"
    overwrite: opt.Overwrite = False

    def outputs(self, *, xmp_name_given: bool) -> Outputs:
        """describe's value: the sidecars' name pattern only where the user gave one (else each
        file's own convention, IMG.jpg.xmp or IMG.xmp, is read from the folder)."""
        from edgevlm.describe.runs import Outputs

        return Outputs(self.write_captions, self.jsonl, self.out_dir, self.write_xmp, self.embed,
                       xmp_name=self.xmp_name if xmp_name_given else None, overwrite=self.overwrite)


GROUPS = (DeviceOptions, ModelOptions, ViewOptions, OutputOptions)
# Each group's defaults, as a command's parameter defaults (frozen: one value serves them all).
LOCAL, DEFAULT_PAIR, AUTO_VIEW, TO_STDOUT = DeviceOptions(), ModelOptions(), ViewOptions(), OutputOptions()


def grouped(command: Callable[..., R]) -> Callable[..., R]:
    """The command as Typer should see it: each parameter whose type is a group replaced by the
    group's fields, as options in its place; called, the fields become the group's value again.
    Every parameter is keyword-only (Typer passes them so), so the order may mix defaults freely."""
    hints = typing.get_type_hints(command, include_extras=True)
    shown: list[inspect.Parameter] = []
    members: dict[str, tuple[type, tuple[str, ...]]] = {}
    for name, parameter in inspect.signature(command).parameters.items():
        kind = hints.get(name, parameter.annotation)
        if kind in GROUPS:
            fields = dataclasses.fields(kind)
            types = typing.get_type_hints(kind, include_extras=True)
            shown += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                        annotation=types[f.name]) for f in fields]
            members[name] = (kind, tuple(f.name for f in fields))
        else:
            shown.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=kind))
    names = [parameter.name for parameter in shown]
    if len(set(names)) != len(names):
        raise TypeError(f"{command.__name__}: a group's option repeats another parameter's name")

    @functools.wraps(command)
    def run(**given: Any) -> R:
        for name, (kind, fields) in members.items():
            given[name] = kind(**{field: given.pop(field) for field in fields})
        return command(**given)

    run.__signature__ = inspect.Signature(shown)  # type: ignore[attr-defined]  # read by Typer's inspect.signature
    run.__annotations__ = {parameter.name: parameter.annotation for parameter in shown}
    return run
