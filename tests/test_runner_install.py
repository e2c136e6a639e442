"""After ``pip install``, the ``avalanche-color`` command runs a comparison from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import venv
from pathlib import Path

from benchmarks.wheelhouse import package_source



def test_the_wheel_installs_a_console_command_that_compares_from_an_empty_folder(tmp_path):
    # Without PYTHONPATH: a source folder on it (with its .egg-info) would pass for an installed avalanche-color.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    source = package_source(Path(tempfile.mkdtemp(dir=tmp_path)))  # a clean copy: no stale build/ of the repository
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("avalanche_color-*.whl")

    # A fresh environment that reuses this one's dependencies (torch, Avalanche, ...) but not its avalanche_color:
    # they are put on its path after the wheel is installed, so pip does not take this one's for it.
    environment = tmp_path / "env"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
                             capture_output=True, text=True, timeout=300, env=env)
    assert install.returncode == 0 and (environment / "bin" / "avalanche-color").exists(), install.stdout[-3000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, env=env).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    empty = tmp_path / "anywhere"
    empty.mkdir()
    run = subprocess.run([str(environment / "bin" / "avalanche-color"), "compare", "--benchmark", "digits_class",
                          "--methods", "CoLoR", "Naive", "--epochs", "1", "--loggers"],
                         cwd=empty, capture_output=True, text=True, timeout=600, env={**env, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((empty / "runs" / "digits_class" / "results.json").read_text())
    assert [r["label"] for r in result["runs"]] == ["CoLoR", "Naive"]
    assert result["config"]["command"].startswith("avalanche-color compare --benchmark digits_class")
    where = subprocess.run([str(python), "-c", "import avalanche_color.runner as r; print(r.__file__)"], cwd=empty,
                           capture_output=True, text=True, env=env, check=True).stdout
    assert where.startswith(str(environment))  # the wheel's copy ran, not the repository's
