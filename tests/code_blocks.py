"""The fenced code blocks of the README and the docs pages, and running a page's Python blocks.

A Python block that cannot run offline is marked by a comment on the line right before its fence,
saying why::

    <!-- not run: needs torchrun, several processes -->
    ```python

Every other ``python`` block runs: a page's blocks in order, in one fresh interpreter (so later blocks
see what earlier ones defined), in an empty folder, offline, on one thread. A page runs once per test
session; the tests that read its output share the run.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPOSITORY = Path(__file__).resolve().parents[1]
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>[^>]*?) -->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<language>[\w+-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
                   re.DOTALL | re.MULTILINE)
PAGE_TIMEOUT = 300  # seconds for all of one page's blocks


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    not_run: Optional[str]  # the reason given in the marker before the fence, if any


def pages() -> list[Path]:
    """The README and every docs page."""
    return [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    text = page.read_text()
    found = []
    for fence in FENCE.finditer(text):
        before = text[:fence.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marker = NOT_RUN.fullmatch(before)
        code = "\n".join(line[len(fence["indent"]):] for line in fence["code"].split("\n"))
        found.append(Block(str(page.relative_to(REPOSITORY)), text.count("\n", 0, fence.start()) + 1,
                           fence["language"], code, marker["reason"] if marker else None))
    return found


def runnable(page: Path) -> list[Block]:
    return [block for block in blocks(page) if block.language == "python" and block.not_run is None]


# Runs in the child: each block compiled with its own page and line, so a traceback points into the page.
DRIVER = """
import ast, json, sys
namespace = {"__name__": "__main__"}
for block in json.load(open(sys.argv[1])):
    tree = ast.increment_lineno(ast.parse(block["code"]), block["line"])
    exec(compile(tree, block["page"], "exec"), namespace)
"""


@dataclass(frozen=True)
class PageRun:
    returncode: int
    stdout: str
    stderr: str
    folder: Path  # where the blocks ran (files they wrote are there)


@functools.lru_cache(maxsize=None)
def run_page(page: Path) -> PageRun:
    """Runs ``page``'s runnable Python blocks in order in a fresh interpreter, in a new empty folder."""
    folder = Path(tempfile.mkdtemp(prefix="page-"))
    code = [{"page": block.page, "line": block.line, "code": block.code} for block in runnable(page)]
    (folder / ".blocks.json").write_text(json.dumps(code))
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", DRIVER, str(folder / ".blocks.json")], cwd=folder,
                         env=environment, capture_output=True, text=True, timeout=PAGE_TIMEOUT)
    return PageRun(run.returncode, run.stdout, run.stderr, folder)
