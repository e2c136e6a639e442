"""The offline install (benchmarks.wheelhouse): what the wheelhouse leaves out, the torch range it checks, and an
install with --no-index into a fresh environment that keeps the torch it already holds."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import torch

from benchmarks import wheelhouse

REPOSITORY = Path(__file__).parents[1]


def report(*names_versions: tuple[str, str]) -> dict:
    return {"install": [{"metadata": {"name": name, "version": version}} for name, version in names_versions]}


def test_the_wheelhouse_leaves_out_torch_and_what_only_torch_needs():
    chosen = wheelhouse.pins(report(("torch", "2.14.1"), ("torchvision", "0.29.1"), ("triton", "3.6.0"),
                                    ("nvidia-cublas", "13.1"), ("cuda-bindings", "13.0"), ("avalanche-color", "0.1.0"),
                                    ("Avalanche_Lib", "0.6.0"), ("torchmetrics", "1.9.0"), ("GPUtil", "1.4.0")))
    assert chosen == ["avalanche-lib==0.6.0", "gputil==1.4.0", "torchmetrics==1.9.0"]


def test_the_torch_range_is_setup_cfgs_and_admits_local_builds():
    assert wheelhouse.torch_range() == ("torch>=2.3,<2.15", "torchvision>=0.18,<0.30")
    assert wheelhouse.admitted("2.13.0+cu130", "torch>=2.3,<2.15")
    assert wheelhouse.admitted(torch.__version__, wheelhouse.torch_range()[0])  # the torch the tests run on
    assert not wheelhouse.admitted("2.15.0", "torch>=2.3,<2.15")
    assert not wheelhouse.admitted("2.2.2", "torch>=2.3,<2.15")


def fresh_environment(where: Path, reuse_this_one: bool) -> Path:
    """A new venv; with ``reuse_this_one`` this environment's packages but avalanche-color (torch among them, pip
    and setuptools too, which a venv's own older setuptools would shadow) are on its path, through links."""
    venv.create(where, with_pip=False)
    python = where / "bin" / "python"
    if reuse_this_one:
        linked = where / "dependencies"
        linked.mkdir()
        for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
            if "avalanche_color" not in entry.name and "avalanche-color" not in entry.name:
                (linked / entry.name).symlink_to(entry)
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        (Path(purelib) / "dependencies.pth").write_text(f"{linked}\n")
    return python


def test_the_install_refuses_an_environment_without_torch(tmp_path):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "requirements.txt").write_text("avalanche-color==0.1.0\n")
    python = fresh_environment(tmp_path / "env", reuse_this_one=False)
    with pytest.raises(SystemExit, match=r"has no torch: install the node's own build first.*supports torch>=2.3"):
        wheelhouse.install(tmp_path / "wheels", str(python))


def test_the_install_takes_the_wheelhouse_alone_and_keeps_the_environments_torch(tmp_path):
    # A wheelhouse of the package's own wheel (its dependencies are this environment's, already on the new
    # environment's path, as torch is on a GPU node): built offline, installed with --no-index.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPOSITORY), "--no-deps", "--no-build-isolation",
                            "-w", str(wheels)], capture_output=True, text=True, timeout=300, env=env)
    assert build.returncode == 0, build.stderr[-3000:]
    [own] = wheels.glob("avalanche_color-*.whl")
    (wheels / "requirements.txt").write_text(f"avalanche-color=={own.name.split('-')[1]}\n")
    python = fresh_environment(tmp_path / "env", reuse_this_one=True)

    installed = wheelhouse.install(wheels, str(python))
    assert installed["torch"] == wheelhouse.installed_torch(sys.executable)[0]  # not replaced
    where = subprocess.run([str(python), "-c", "import avalanche_color; print(avalanche_color.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, env=env, check=True).stdout
    assert where.startswith(str(tmp_path / "env"))
