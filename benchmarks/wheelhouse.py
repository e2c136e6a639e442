"""An offline install: the package and every dependency but torch, as wheels in one folder.

    python -m benchmarks.wheelhouse build --out wheelhouse               # online, once (make wheelhouse)
    python -m benchmarks.wheelhouse install --wheelhouse wheelhouse      # offline, on the GPU node (make install-offline)

``build`` resolves ``avalanche-color[extras]`` (``--extras``, default ``test,benchmarks``; ``''`` for none) at
the versions of ``constraints.txt`` (``pip install --dry-run --report``), leaves out torch, torchvision and what
only they need (``triton``, ``nvidia-*``, ``cuda-*``), and writes the rest as wheels (``pip wheel --no-deps``: a
package published only as source is built once, here), the package's own wheel beside them, and
``requirements.txt`` naming each one. Build it with the Python version and platform of the node (``--python``):
a compiled wheel fits only those.

``install`` installs from that folder alone (``pip install --no-index --find-links``) into the environment of
``--python``, against the torch and torchvision already there, which it checks first: pip keeps an installed
torch that ``setup.cfg``'s range admits and never downloads one. Only the standard library is used, so it runs
before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Optional

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXTRAS = "test,benchmarks"
LEFT_OUT = ("torch", "torchvision", "triton")  # the node's own build; also every nvidia-* and cuda-* package
LEFT_OUT_PREFIXES = ("nvidia-", "cuda-")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def left_out(name: str) -> bool:
    """Whether ``name`` is torch's (the node brings it) rather than a wheel of the wheelhouse."""
    name = canonical(name)
    return name in LEFT_OUT or name.startswith(LEFT_OUT_PREFIXES)


def pins(report: dict) -> list[str]:
    """``name==version`` of every package a ``pip install --report`` would install, but torch's and this one."""
    chosen = []
    for item in report["install"]:
        metadata = item["metadata"]
        name = canonical(metadata["name"])
        if not left_out(name) and name != "avalanche-color":
            chosen.append(f"{name}=={metadata['version']}")
    return sorted(chosen)


def torch_range() -> tuple[str, str]:
    """The torch and torchvision requirements of ``setup.cfg`` (e.g. ``torch>=2.3,<2.15``)."""
    text = (ROOT / "setup.cfg").read_text()
    found = [re.search(rf"^\s*({name}\s*[<>=!~][^\n#]*)$", text, re.M) for name in ("torch", "torchvision")]
    if not all(found):
        raise ValueError("setup.cfg names no torch or torchvision requirement")
    return found[0].group(1).strip(), found[1].group(1).strip()


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, **kwargs)
    if completed.returncode != 0:
        raise SystemExit(f"failed (exit {completed.returncode}): {' '.join(command)}\n"
                         f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}")
    return completed


def size_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file()) / 1e6


def package_source(folder: Path) -> Path:
    """The package's build inputs, copied into ``folder``: setuptools reuses a source tree's ``build/`` and would
    pack modules that no longer exist in it (after a file moves), so the wheel is built from a clean copy."""
    for name in ("pyproject.toml", "setup.cfg", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, folder / name)
    shutil.copytree(ROOT / "avalanche_color", folder / "avalanche_color",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def build(out: Path, python: str, extras: str) -> dict:
    """Write the wheelhouse to ``out``; return what it holds."""
    start = time.perf_counter()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    target = f".[{extras}]" if extras else "."
    with tempfile.TemporaryDirectory() as scratch:
        report_file = Path(scratch) / "report.json"
        run([python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
             str(report_file), "-c", str(ROOT / "constraints.txt"), target])
        wanted = pins(json.loads(report_file.read_text()))
    run([python, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), *wanted])
    with tempfile.TemporaryDirectory() as source:
        run([python, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(package_source(Path(source)))])
    [own] = sorted(out.glob("avalanche_color-*.whl"))[-1:]
    version = own.name.split("-")[1]
    requirement = f"avalanche-color[{extras}]=={version}" if extras else f"avalanche-color=={version}"
    (out / "requirements.txt").write_text("\n".join([requirement, *wanted]) + "\n")
    summary = {"wheels": len(list(out.glob("*.whl"))), "size_mb": round(size_mb(out), 1),
               "seconds": round(time.perf_counter() - start), "left_out": "torch, torchvision, triton, nvidia-*, cuda-*"}
    (out / "wheelhouse.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def installed_torch(python: str) -> tuple[Optional[str], Optional[str]]:
    """The versions of torch and torchvision that ``python``'s environment holds (None where absent)."""
    probe = ("import importlib.metadata as m\nfor name in ('torch', 'torchvision'):\n"
             "    try: print(m.version(name))\n    except m.PackageNotFoundError: print('')\n")
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    return found[0] or None, found[1] or None


def admitted(version: str, requirement: str) -> bool:
    """Whether ``version`` (e.g. ``2.13.0+cu130``) meets ``requirement``'s clauses (e.g. ``torch>=2.3,<2.15``)."""
    def key(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])

    compare = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b,
               ">": lambda a, b: a > b, "==": lambda a, b: a == b}
    clauses = re.match(r"[A-Za-z0-9_.-]+\s*(.*)", requirement).group(1)
    for clause in filter(None, (part.strip() for part in clauses.split(","))):
        operator, bound = re.match(r"(>=|<=|==|<|>)\s*(\S+)", clause).groups()
        if not compare[operator](key(version), key(bound)):
            return False
    return True


def install(wheelhouse: Path, python: str) -> dict:
    """Install from ``wheelhouse`` alone into ``python``'s environment, keeping its torch; return what it took."""
    wheelhouse = wheelhouse.resolve()  # pip runs from the repository's root
    if not (wheelhouse / "requirements.txt").is_file():
        raise SystemExit(f"--wheelhouse {wheelhouse} holds no requirements.txt: build it with "
                         "'python -m benchmarks.wheelhouse build --out DIR' (make wheelhouse)")
    before = installed_torch(python)
    for name, version, requirement in zip(("torch", "torchvision"), before, torch_range()):
        if version is None:
            raise SystemExit(f"{python} has no {name}: install the node's own build first (the wheelhouse leaves "
                             f"torch out); avalanche-color supports {requirement}")
        if not admitted(version, requirement):
            raise SystemExit(f"{python} has {name} {version}; avalanche-color supports {requirement}")
    start = time.perf_counter()
    run([python, "-m", "pip", "install", "--no-index", "--find-links", str(wheelhouse), "--quiet",
         "-r", str(wheelhouse / "requirements.txt")])
    after = installed_torch(python)
    if after != before:
        raise SystemExit(f"pip replaced torch/torchvision {before[0]}/{before[1]} by {after[0]}/{after[1]}")
    return {"torch": before[0], "torchvision": before[1], "seconds": round(time.perf_counter() - start)}


def main(argv: Optional[Iterable[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="write the wheelhouse (needs the package index)")
    make.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    make.add_argument("--extras", default=DEFAULT_EXTRAS, help=f"the package's extras to include (default {DEFAULT_EXTRAS})")
    make.add_argument("--python", default=sys.executable, help="the Python whose pip resolves and builds (the node's version)")
    put = commands.add_parser("install", help="install from the wheelhouse alone, keeping the environment's torch")
    put.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    put.add_argument("--python", default=sys.executable, help="the Python of the environment to install into")
    args = parser.parse_args(list(argv) if argv is not None else None)
    result = (build(args.out, args.python, args.extras) if args.command == "build"
              else install(args.wheelhouse, args.python))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
