"""The option types every `workbench` command shares, defined once: a config is the CONFIG
argument everywhere (`-c/--config` is its alias, for the commands whose first argument is
something else and for old scripts), overrides are `-s/--set KEY=VALUE`, an output folder is
`-o/--out`. `config_path` takes both spellings of the config and refuses two different ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.config import load_config

ConfigArg = Annotated[Path | None, typer.Argument(
    help="Experiment YAML config (also -c/--config).", show_default=False)]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", help="The experiment YAML config, as an option (the same as the "
                           "CONFIG argument).", show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-s", help="Override a config key, e.g. -s models.chat.spec=/models/qwen or "
                        "-s federated.rounds=5 (repeatable).")]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Folder to write into.")]


def config_path(argument: Path | None, option: Path | None) -> Path | None:
    """The config given as CONFIG or as -c/--config; both at once must name the same file."""
    if argument is not None and option is not None and \
            Path(argument).resolve() != Path(option).resolve():
        raise typer.BadParameter(f"the config is given twice ({argument} and {option}); "
                                 "give it once", param_hint="CONFIG / --config")
    return argument if argument is not None else option


def load(argument: Path | None, option: Path | None = None, overrides: list[str] | None = None,
         *extra: str):
    """The validated experiment config from CONFIG / -c and -s overrides (then `extra`)."""
    return load_config(config_path(argument, option), [*(overrides or []), *extra])
