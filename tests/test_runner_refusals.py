"""Every refusal of ``avalanche-color compare`` is one line naming the flag, the value and the fix, and leaves
nothing behind: a file that is not weights, a flag a benchmark does not take, an output folder that cannot be
written."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from avalanche_color.runner.cli import main


def refusal(*flags: str) -> str:
    """The one line ``compare`` exits with for ``flags``, without its prefix."""
    with pytest.raises(SystemExit) as exit_:
        main(["compare", *flags])
    message = str(exit_.value)
    assert "\n" not in message and message.startswith("avalanche-color compare: error: "), message
    assert "Traceback" not in message and "\x1b" not in message
    return message.removeprefix("avalanche-color compare: error: ")


class NotWeights:
    """An object torch.save pickles, which torch.load(weights_only=True) refuses to load."""


@pytest.mark.parametrize("name, content, expected", [
    ("README.md", b"# A project\n\nSome text.\n", "is not a weights file (torch.load cannot read it)"),
    ("model.pt", None, "holds more than weights (objects torch.load(weights_only=True) does not load, for safety"),
    ("model.safetensors", b"not a safetensors file", "is not a readable safetensors file"),
])
def test_a_file_that_is_not_weights_is_refused_naming_the_flag_and_the_files_it_takes(tmp_path, name, content,
                                                                                      expected):
    path = tmp_path / name
    if content is None:
        torch.save({"model": NotWeights()}, path)
    else:
        path.write_bytes(content)
    message = refusal("--benchmark", "digits_class", "--backbone", str(path), "--out-dir", str(tmp_path / "runs"))
    assert message.startswith(f"--backbone {path}: {str(path)!r} {expected}")
    assert message.endswith("give a file save_backbone wrote, or a timm state dict (.pth/.pt/.bin/.safetensors) with "
                            "--architecture NAME")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("benchmark", ["digits_class", "digits_domain", "split_cifar100"])
def test_train_per_class_on_a_benchmark_that_takes_none_names_itself_and_the_benchmarks_that_do(tmp_path, benchmark):
    message = refusal("--benchmark", benchmark, "--train-per-class", "5", "--out-dir", str(tmp_path / "runs"))
    assert message == (f"--train-per-class 5: is not supported for {benchmark}: only pacs, split_tiny_imagenet, "
                       "image_folder_class, image_folder_domain take it")
    assert not (tmp_path / "runs").exists()


def test_an_output_folder_under_a_file_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "notes.txt").write_text("a file")
    out_dir = tmp_path / "notes.txt" / "runs"
    message = refusal("--benchmark", "digits_class", "--out-dir", str(out_dir))
    assert message == (f"--out-dir {out_dir}: cannot be made: {str(tmp_path / 'notes.txt')!r} is a file, not a "
                       "folder; give --out-dir a folder")
    assert (tmp_path / "notes.txt").read_text() == "a file"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs: a folder nobody can make folders in")
def test_an_output_folder_nobody_can_make_is_refused_naming_the_flag_and_the_fix():
    message = refusal("--benchmark", "digits_class", "--out-dir", "/proc/avalanche-color-runs")
    assert message.startswith("--out-dir /proc/avalanche-color-runs: cannot be written: '/proc' does not let a "
                              "folder be made in it (")
    assert message.endswith("); give --out-dir a folder you can write to")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permissions do not bind the superuser")
def test_an_unwritable_output_folder_is_refused_and_left_as_it_was(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        message = refusal("--benchmark", "digits_class", "--out-dir", str(locked / "runs"))
        assert message.startswith(f"--out-dir {locked / 'runs'}: cannot be written: {str(locked)!r} does not let a "
                                  "folder be made in it (Permission denied)")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("name, problem", [("a\0b", "a name with a NUL byte"), ("x" * 300, "a name of 300 bytes")])
def test_a_name_the_system_cannot_make_is_refused(tmp_path, name, problem):
    message = refusal("--benchmark", "digits_class", "--out-dir", str(tmp_path / name / "runs"))
    assert message.startswith("--out-dir ") and f"is not a folder this system can make ({problem}" in message
    assert list(tmp_path.iterdir()) == []
