"""A machine that keeps its own torch: the install path docs/installing.md gives keeps it (pip's resolver, offline,
on stand-in wheels), and a torchvision made for another torch build is named at the first import, in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from avalanche_color.utils.install_check import fix_command, mismatch_message
from benchmarks import wheelhouse

REPOSITORY = Path(__file__).parents[1]
NMS = "operator torchvision::nms does not exist"


def _python(code: str, cwd: Path, pythonpath: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=180,
                          env={"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def stand_in_torchvision(folder: Path, raises: str) -> Path:
    """A torchvision package, first on the path, whose import raises ``raises`` as PyPI's torchvision raises
    beside a torch of another build (its operators register against torch on import)."""
    (folder / "torchvision").mkdir(parents=True)
    (folder / "torchvision" / "__init__.py").write_text(f"raise RuntimeError({raises!r})\n")
    return folder


def test_a_torchvision_of_another_torch_build_is_named_in_one_line_with_the_fix(tmp_path):
    path = stand_in_torchvision(tmp_path / "path", NMS)
    run = _python("import avalanche_color\nfrom avalanche_color import CoLoR", tmp_path, f"{path}:{REPOSITORY}")
    assert run.returncode != 0
    torch, torchvision = metadata.version("torch"), metadata.version("torchvision")
    last = run.stderr.strip().splitlines()[-1]
    assert last == f"ImportError: {mismatch_message(torch, torchvision, NMS)}"
    assert f"torchvision {torchvision} does not work with the installed torch {torch} ({NMS})" in last
    assert last.endswith(f"{fix_command(torch)} (avalanche_color docs, Installing)")
    # The raw error is not shown again as a second traceback above it: its line is in the message.
    assert "RuntimeError" not in run.stderr and "The above exception" not in run.stderr


def test_the_runner_names_a_torchvision_of_another_torch_build_in_its_one_line_error(tmp_path):
    path = stand_in_torchvision(tmp_path / "path", NMS)
    run = subprocess.run([sys.executable, "-m", "avalanche_color.runner", "compare", "--benchmark", "digits_class",
                          "--out-dir", str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=180, env={"PYTHONPATH": f"{path}:{REPOSITORY}", "PATH": "/usr/bin:/bin"})
    torch, torchvision = metadata.version("torch"), metadata.version("torchvision")
    assert run.returncode != 0 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"avalanche-color compare: error: ImportError: {mismatch_message(torch, torchvision, NMS)} "
        "(--debug or AVALANCHE_COLOR_DEBUG=1 shows the traceback)"]
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_import_alone_does_not_touch_torchvision_and_another_failure_of_it_stays_as_it_is(tmp_path):
    path = stand_in_torchvision(tmp_path / "path", "CUDA driver initialization failed")
    quiet = _python("import sys, avalanche_color\nprint('torchvision' in sys.modules)", tmp_path,
                    f"{path}:{REPOSITORY}")
    assert quiet.returncode == 0 and quiet.stdout.strip() == "False" and quiet.stderr == ""
    other = _python("from avalanche_color import CoLoR", tmp_path, f"{path}:{REPOSITORY}")
    assert other.stderr.strip().splitlines()[-1] == "RuntimeError: CUDA driver initialization failed"


def test_the_fix_names_the_torchvision_of_the_torch_it_was_given_and_that_builds_index():
    # The pair this project is tested with: the rule gives the torchvision pinned beside torch.
    pins = dict(line.split("==") for line in (REPOSITORY / "constraints.txt").read_text().splitlines()
                if line.startswith(("torch==", "torchvision==")))
    assert fix_command(pins["torch"]).endswith(f"torchvision=={pins['torchvision']}")
    assert fix_command("2.13.0+cpu") == ("pip install --force-reinstall --no-deps "
                                         "--index-url https://download.pytorch.org/whl/cpu torchvision==0.28.0")
    assert fix_command("2.5.1+cu124").endswith("--index-url https://download.pytorch.org/whl/cu124 torchvision==0.20.1")
    assert fix_command("2.13.0") == "pip install --force-reinstall --no-deps torchvision==0.28.0"  # from PyPI
    assert "--index-url" not in fix_command("2.13.0+gitabc123")  # a local build: no index publishes it
    assert "<the release made for torch 2.15.0a0+git1" in fix_command("2.15.0a0+git1")
    assert "--no-deps" in fix_command("2.3.0")  # the fix never touches torch


# ------------------------------------------------------------------ what pip's resolver does with a kept torch


def stand_in_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel holding only its metadata: enough for pip's resolver, which is what these tests ask about."""
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {f"{dist_info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
                 name, version, "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)),
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
    wheel = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture
def index(tmp_path) -> Path:
    """A wheel folder like PyPI plus PyTorch's CPU index: torch and torchvision releases, each torchvision
    requiring its own torch (as theirs do), and avalanche-color requiring setup.cfg's torch and torchvision."""
    folder = tmp_path / "index"
    folder.mkdir()
    pins = dict(line.split("==") for line in (REPOSITORY / "constraints.txt").read_text().splitlines()
                if line.startswith(("torch==", "torchvision==")))
    stand_in_wheel(folder, "torch", pins["torch"])
    stand_in_wheel(folder, "torchvision", pins["torchvision"], (f"torch=={pins['torch']}",))
    stand_in_wheel(folder, "torch", "2.13.0+cpu")
    stand_in_wheel(folder, "torchvision", "0.28.0+cpu", ("torch==2.13.0",))
    stand_in_wheel(folder, "avalanche-color", "0.1.0", wheelhouse.torch_range())
    return folder


def pip(environment: Path, index: Path, *arguments: str) -> dict[str, str]:
    """Runs ``pip install --dry-run`` (or an install, with ``--no-dry-run`` first) for ``environment`` offline;
    the packages it would install, name -> version."""
    install = ["--no-index", "--find-links", str(index), "--disable-pip-version-check", "--quiet"]
    dry_run = arguments[:1] != ("--no-dry-run",)
    report = environment.parent / "report.json"
    command = [sys.executable, "-m", "pip", "--python", str(environment / "bin" / "python"), "install", *install,
               *(["--dry-run", "--report", str(report)] if dry_run else []), *arguments[0 if dry_run else 1:]]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # only the command line's options: no index or constraint of the machine
    run = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    if not dry_run:
        return {}
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}


@pytest.mark.slow  # six pip runs: about 10 s
def test_the_documented_install_keeps_an_installed_torch_and_the_pinned_one_would_not(tmp_path, index):
    environment = tmp_path / "env"
    venv.create(environment, with_pip=False)
    pip(environment, index, "--no-dry-run", "torch==2.13.0+cpu")
    # torch alone: the newest torchvision in range needs another torch, so pip replaces the user's torch.
    assert pip(environment, index, "avalanche-color")["torch"] != "2.13.0+cpu"
    # The documented path: the torchvision of that torch first, then the package; pip keeps both.
    pip(environment, index, "--no-dry-run", "torchvision==0.28.0+cpu")
    assert pip(environment, index, "avalanche-color") == {"avalanche-color": "0.1.0"}
    # In a clone, constraints.txt less its torch pair (the command docs/installing.md gives) keeps them too,
    # while constraints.txt itself would replace torch with its pin.
    pinned = (REPOSITORY / "constraints.txt").read_text().splitlines()
    own_torch = tmp_path / "constraints-own-torch.txt"
    own_torch.write_text("".join(f"{line}\n" for line in pinned if not line.startswith(("torch==", "torchvision=="))))
    assert pip(environment, index, "-c", str(own_torch), "avalanche-color") == {"avalanche-color": "0.1.0"}
    assert "torch" in pip(environment, index, "-c", str(REPOSITORY / "constraints.txt"), "avalanche-color")
