"""Option groups (cli/groups.py): declared once as frozen values, shown to Typer as the command's
own options, handed to the command as the value again."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from edgevlm.cli import groups
from edgevlm.cli.groups import DeviceOptions, ModelOptions, OutputOptions, ViewOptions, grouped

APP = Path(__file__).resolve().parents[2] / "edgevlm" / "cli" / "app.py"


def test_a_group_is_its_fields_to_typer_and_one_value_to_the_command() -> None:
    got: list[object] = []

    @grouped
    def command(first: Annotated[int, typer.Option()] = 1, devices: DeviceOptions = groups.LOCAL,
                last: Annotated[str, typer.Option()] = "x") -> None:
        got.append((first, devices, last))

    names = list(inspect.signature(command).parameters)
    fields = [f.name for f in dataclasses.fields(DeviceOptions)]
    assert names == ["first", *fields, "last"]  # in the group's place
    app = typer.Typer()
    app.command()(command)
    done = CliRunner().invoke(app, ["--tensor-split", "3,1", "--main-gpu", "1", "--last", "y"])
    assert done.exit_code == 0, done.output
    devices = DeviceOptions(tensor_split="3,1", main_gpu=1)
    assert got == [(1, devices, "y")] and devices.placement().tensor_split == (3.0, 1.0)


def test_a_group_whose_option_repeats_a_parameter_is_refused_when_declared() -> None:
    with pytest.raises(TypeError, match="repeats"):
        @grouped
        def command(model: Annotated[str, typer.Option()] = "",
                    using: ModelOptions = groups.DEFAULT_PAIR) -> None:
            """Two --model options."""


def _commands() -> dict[str, dict[str, str]]:
    """Each command in cli/app.py: the parameters it declares itself, with their annotations."""
    found = {}
    for node in ast.walk(ast.parse(APP.read_text())):
        if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).startswith("app.command") for d in node.decorator_list):
            found[node.name] = {a.arg: ast.unparse(a.annotation) if a.annotation else ""
                                for a in [*node.args.args, *node.args.kwonlyargs]}
    return found


def test_the_groups_options_are_declared_once() -> None:
    """The commands that load a model take the model and device groups and declare none of their
    options themselves; no command declares a device, view or output option of its own. `plan` names the
    model's files and context itself: it plans a model and loads none, so it takes no layers,
    threads or --fetch; `parity` checks what a model is shown at one --detail."""
    commands = _commands()
    own = {f.name for group in (DeviceOptions, ViewOptions, OutputOptions) for f in dataclasses.fields(group)}
    loading = {f.name for f in dataclasses.fields(ModelOptions)}
    for name, parameters in commands.items():  # parity checks at one --detail, the plan's tiles
        assert not set(parameters) & own - ({"detail"} if name == "parity" else set()), name
    for name in ("describe", "chat", "serve", "bench"):
        types = set(commands[name].values())
        assert {"ModelOptions", "DeviceOptions"} <= types and not set(commands[name]) & loading, name
    assert set(commands["plan"]) & loading == {"model", "mmproj", "n_ctx", "swa_full"}
    assert "DeviceOptions" in commands["plan"].values()
    assert all("ViewOptions" in commands[name].values() for name in ("describe", "chat", "serve"))
    assert "OutputOptions" in commands["describe"].values()
