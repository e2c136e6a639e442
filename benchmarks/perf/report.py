"""What the markdown says about a run (its command, its machine), and putting a section into it."""

from __future__ import annotations

import argparse
import platform
import shlex

import torch


def command_line(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``python -m benchmarks.perf`` with every option that differs from its default."""
    options = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {shlex.quote(str(v))}")
                       for k, v in vars(args).items() if k != "out" and v != parser.get_default(k))
    return f"python -m benchmarks.perf {options}".strip()


def machine(device: torch.device) -> str:
    return (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")


def replace_section(text: str, section: str) -> str:
    """``text`` with the section whose heading is ``section``'s first line replaced by ``section`` (up to
    the next heading of that level, or the end), or with ``section`` appended when it has none."""
    heading = section.splitlines()[0]
    level = heading.split(" ")[0] + " "
    lines = text.splitlines()
    if heading not in lines:
        return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(level)), len(lines))
    rest = lines[end:]
    return "\n".join(lines[:start] + section.rstrip("\n").splitlines() + ([""] + rest if rest else [])) + "\n"


def plural(count: int, word: str = "expert") -> str:
    return word if count == 1 else word + "s"
