"""The ``avalanche-color`` command (also ``python -m avalanche_color.runner``): its flags are made
from :class:`~avalanche_color.runner.config.RunConfig`'s fields, so each default and help text is
written once, there.

    avalanche-color compare --benchmark digits_class --methods CoLoR Naive --epochs 1

A setting that cannot run is refused in one line naming the flag, its value and what to give
instead; ``--debug`` (or ``AVALANCHE_COLOR_DEBUG=1``) shows the traceback. Parsing imports no
torch, so ``--help`` and a bad flag answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
import textwrap
import warnings
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TextIO, Union

from avalanche_color.runner.config import BUDGET, DEFAULT_OUT, RunConfig, RunConfigError, folder_name, setting
from avalanche_color.runner.methods import methods_taking
from avalanche_color.utils.checks import boolean, missing_device, optional, path, text
from avalanche_color.utils.install_check import check_torch_pair

PROGRAM = "avalanche-color"
DEBUG_ENV = "AVALANCHE_COLOR_DEBUG"
BACKEND_ENV = "AVALANCHE_COLOR_BACKEND"  # under torchrun: "nccl" or "gloo" (default: NCCL where CUDA is)


@dataclass(frozen=True)
class CommandLine:
    """The command line's own settings: where the output goes, and how errors show."""

    name: Optional[str] = setting(None, "the output folder's name (default: the benchmark)", optional(text))
    out_dir: Path = setting(DEFAULT_OUT, "the folder the output folder goes in", path)
    debug: bool = setting(False, f"show the traceback of an error (also: {DEBUG_ENV}=1)", boolean)
    quiet: bool = setting(False, "show no progress bars (runs, experiences, epochs); errors and the final table "
                                 "still print", boolean)

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            problem = spec.metadata["check"](getattr(self, spec.name))
            if problem:
                raise RunConfigError(spec.name, getattr(self, spec.name), problem)


# The titled groups of flags in --help (a setting's ``group``): title and description.
GROUPS = {BUDGET: ("the comparison's budget",
                   "What every method of the run gets alike: short, for small data and CPUs.\nA method's own "
                   "defaults (CoLoR's 50 epochs at batch 128 ...) are its paper's: --preset paper takes them.")}


def flag(spec: dataclasses.Field) -> str:
    return spec.metadata["flag"] or "--" + spec.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, options: type) -> None:
    """One flag per command-line field of the dataclass ``options``: its type, several values for a
    tuple, a switch for a bool; absent flags stay out of the namespace, so the dataclass's defaults
    (and a preset's) apply."""
    groups: dict[str, Any] = {}
    for spec in dataclasses.fields(options):
        if not spec.metadata["cli"]:
            continue
        kind = str(spec.type).removeprefix("Optional[").removesuffix("]")
        default = spec.default
        shown = "" if default in (None, MISSING, False) else f" (default: {_shown(default)})"
        choices = spec.metadata["choices"]
        listed = "" if choices is None else f"; one of {', '.join(choices)}"
        taken = f"; taken by {', '.join(methods_taking(spec.name))}" if spec.metadata.get("per_method") else ""
        # A help text may quote an option's declared doc, written for docstrings: shown unmarked.
        text = plain_text(spec.metadata["help"]) + shown + listed + taken
        arguments: dict[str, Any] = dict(help=text, dest=spec.name, choices=choices)
        if kind == "bool":
            arguments = dict(help=arguments["help"], dest=spec.name, action="store_true")
        else:
            arguments["type"] = {"int": int, "float": float, "Path": Path}.get(kind.split("[")[-1].split(",")[0],
                                                                               str)
            if kind.startswith("tuple"):
                arguments["nargs"] = "*" if default == () or spec.name == "loggers" else "+"
            name = flag(spec).removeprefix("--").replace("-", "_")
            arguments["metavar"] = (name.removesuffix("s") if kind.startswith("tuple") else name).upper()
        if default is MISSING:
            arguments["required"] = True
        group = spec.metadata["group"]
        if group and group not in groups:
            groups[group] = parser.add_argument_group(*GROUPS[group])
        groups.get(group, parser).add_argument(flag(spec), default=argparse.SUPPRESS, **arguments)


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def plain_text(docstring: str) -> str:
    """A docstring as a terminal shows it: ````code```` and Sphinx roles (``:mod:`~a.b```) without their marks."""
    text = re.sub(r":[\w:]+:`~?([^`]+)`", r"\1", docstring)
    return text.replace("``", "")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's lines (its example commands) and wraps the flags' help at spaces only, so no
    flag or method name (``--baseline-seeds``, ``CoLoR-gaussian``) is split at its hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)


def parser() -> argparse.ArgumentParser:
    import avalanche_color.runner as runner

    main_parser = argparse.ArgumentParser(prog=PROGRAM, description="CoLoR and its peers and baselines, compared "
                                                                    "on continual-learning streams.")
    commands = main_parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    compare = commands.add_parser("compare", help="compare methods on a benchmark",
                                  description=plain_text(runner.__doc__ or ""), formatter_class=HelpFormatter)
    add_flags(compare, RunConfig)
    add_flags(compare, CommandLine)
    return main_parser


def config_from(args: argparse.Namespace, argv: Sequence[str]) -> tuple[RunConfig, CommandLine]:
    """The run configuration and command-line settings the parsed flags give."""
    given = {name: tuple(value) if isinstance(value, list) else value for name, value in vars(args).items()
             if name != "command"}
    own = CommandLine(**{spec.name: given.pop(spec.name) for spec in dataclasses.fields(CommandLine)
                         if spec.name in given})
    out = own.out_dir / (own.name or folder_name(given["benchmark"]))
    config = RunConfig.from_preset(given.pop("preset", None), **given, out=out,
                                   command=f"{PROGRAM} " + shlex.join(argv))
    return config, own


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Runs the command ``argv`` (default: the process's arguments); returns the comparison's results."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command_parser = parser()
    args = command_parser.parse_args(argv)
    debug = getattr(args, "debug", False) or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    own: Optional[CommandLine] = None
    try:
        config, own = config_from(args, argv)
        return compare(config, progress=not own.quiet)
    except RunConfigError as error:
        if debug:
            raise
        sys.exit(f"{PROGRAM} {args.command}: error: {_flag_and_value(error, own)}: {error.problem}")
    except Exception as error:  # noqa: BLE001 (one line for any failure; --debug shows where)
        if debug:
            raise
        sys.exit(f"{PROGRAM} {args.command}: error: {type(error).__name__}: {error} "
                 f"(--debug or {DEBUG_ENV}=1 shows the traceback)")


def _flag_and_value(error: RunConfigError, own: Optional[CommandLine] = None) -> str:
    if error.field == "out":  # the output folder is --out-dir/--name: the folder the user gave
        return "--out-dir" if own is None else f"--out-dir {own.out_dir}"
    fields = {spec.name: spec for spec in (*dataclasses.fields(RunConfig), *dataclasses.fields(CommandLine))}
    name = flag(fields[error.field]) if error.field in fields else error.field
    value = error.value
    if value is None or value is True:
        return name
    return f"{name} {_shown(tuple(value)) if isinstance(value, (tuple, list)) else value}"


def compare(config: RunConfig, progress: bool = True) -> dict[str, Any]:
    """Runs the comparison (on several processes under torchrun) and prints its table; ``progress``: bars
    for the runs and, inside each, its experiences, epochs and iterations with an ETA (main process only)."""
    check_torch_pair()  # a torchvision of another torch build: its one line with the fix, before Avalanche's import
    import torch
    from avalanche.distributed import DistributedHelper

    from avalanche_color import init_distributed
    from avalanche_color.runner.comparison import run_comparison

    check_device(config.device)  # before anything is written
    # Avalanche's notices about its own internals, not about this run: kept off the terminal.
    warnings.filterwarnings("ignore", message="No loggers specified")
    hide_avalanche_deprecations()
    if launched_by_torchrun():  # NCCL where CUDA is, each rank on cuda:{LOCAL_RANK} of its node
        init_distributed(config.seeds[0], backend=os.environ.get(BACKEND_ENV) or None)
    main_process = DistributedHelper.is_main_process  # read before the process group goes
    try:
        result = run_comparison(config, progress=progress and main_process)
    finally:
        if DistributedHelper.is_distributed:
            torch.distributed.destroy_process_group()
    if main_process:
        print(f"\n{result['table']}\n\nwritten to {config.output_folder}")
    return result


def check_device(device: str) -> None:
    """Refuse (:class:`RunConfigError` for ``--device``) a device this machine does not have, before anything is
    loaded or written: the strategies' check (:func:`~avalanche_color.utils.checks.missing_device`), worded for
    the command line, and ``auto``."""
    if device == "auto":
        return
    try:
        missing = missing_device(device)
    except ValueError:
        raise RunConfigError("device", device, "must be cpu, cuda, cuda:N or auto (cuda where there is one)") from None
    if missing is not None:
        raise RunConfigError("device", device, f"{missing}; pass --device cpu, or --device auto to use CUDA where "
                                               f"there is one")


def console() -> None:
    """The ``avalanche-color`` console command."""
    main()


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process as one of several."""
    return "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def hide_avalanche_deprecations() -> None:
    """Avalanche's deprecation notices about its own internals, kept off the terminal.

    A filter cannot do it: Avalanche's ``deprecated`` decorator puts its own filter first
    on every call (``warnings.simplefilter("once")``), so they are dropped when shown.
    """
    if not isinstance(warnings.showwarning, _WithoutAvalancheDeprecations):  # main() called again: wrapped already
        warnings.showwarning = _WithoutAvalancheDeprecations(warnings.showwarning)


# warnings.showwarning's signature: (message, category, filename, lineno, file, line)
ShowWarning = Callable[[Union[Warning, str], type[Warning], str, int, Optional[TextIO], Optional[str]], None]


class _WithoutAvalancheDeprecations:
    """A ``warnings.showwarning`` that shows every warning with ``show`` but Avalanche's deprecation notices
    about its own code."""

    avalanche = f"{os.sep}avalanche{os.sep}"

    def __init__(self, show: ShowWarning) -> None:
        self.show = show

    def __call__(self, message: Union[Warning, str], category: type[Warning], filename: str, lineno: int,
                 file: Optional[TextIO] = None, line: Optional[str] = None) -> None:
        if not (issubclass(category, DeprecationWarning) and self.avalanche in filename):
            self.show(message, category, filename, lineno, file, line)
