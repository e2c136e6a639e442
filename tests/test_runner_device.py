"""Issue 39, point 5: --device is checked before anything is written, and a failed attempt never
blocks a later --resume with the original settings."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from avalanche_color.runner.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def fixed_code_digest(monkeypatch):
    # The provenance's digest of the package's code: fixed, so that an edit elsewhere in the tree
    # while the test runs does not make the comparisons differ.
    monkeypatch.setattr("avalanche_color.runner.provenance.code_digest", lambda: "code")


def flags(backbone: str, out, *more: str) -> list[str]:
    return ["compare", "--benchmark", "digits_class", "--methods", "CoLoR", "--epochs", "1", "--rank", "2",
            "--backbone", backbone, "--loggers", "text", "--out-dir", str(out), "--name", "run", "--quiet", *more]


@pytest.mark.parametrize("device, message", [
    ("cuda", r"--device cuda: this machine has no CUDA device \(torch.cuda.is_available\(\) is False"),
    ("cuda:1", r"--device cuda:1: this machine has no CUDA device"),
    ("gpu", r"--device gpu: must be cpu, cuda, cuda:N or auto"),
])
def test_a_device_this_machine_lacks_is_refused_before_anything_is_written(tiny_backbone, tmp_path, monkeypatch,
                                                                          device, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=message):
        main(flags(tiny_backbone, tmp_path, "--device", device))
    assert not (tmp_path / "run").exists()


def test_a_cuda_index_beyond_the_devices_is_refused(tiny_backbone, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit, match=r"--device cuda:3: this machine has 1 CUDA device\(s\): cuda:0 to cuda:0"):
        main(flags(tiny_backbone, tmp_path, "--device", "cuda:3"))
    assert not (tmp_path / "run").exists()


def fail_colors_runs(monkeypatch):
    from avalanche_color.runner.methods import REGISTRY

    def fails(*args, **kwargs):
        raise RuntimeError("the run fails")

    monkeypatch.setitem(REGISTRY, "CoLoR", dataclasses.replace(REGISTRY["CoLoR"], build=fails))


def test_a_failed_attempt_with_other_settings_does_not_block_resuming_the_original(tiny_backbone, tmp_path,
                                                                                    monkeypatch):
    with monkeypatch.context() as patch:  # an attempt that failed before finishing any run
        fail_colors_runs(patch)
        with pytest.raises(SystemExit, match="the run fails"):
            main(flags(tiny_backbone, tmp_path, "--device", "cpu", "--k", "3"))
    assert (tmp_path / "run" / "attempt" / "runs" / "provenance.json").exists()
    result = main(flags(tiny_backbone, tmp_path, "--resume"))  # other settings: nothing to continue
    assert [run["method"] for run in result["runs"]] == ["CoLoR"] and not (tmp_path / "run" / "attempt").exists()


def test_a_failed_attempt_with_finished_runs_does_not_block_resuming_the_completed_comparison(tiny_backbone, tmp_path,
                                                                                             monkeypatch):
    from avalanche_color.runner.methods import REGISTRY

    both = flags(tiny_backbone, tmp_path, "--methods", "CoLoR", "Naive")
    first = main(both)
    with monkeypatch.context() as patch:  # a rerun with other settings: CoLoR finishes, Naive fails
        patch.setitem(REGISTRY, "Naive", dataclasses.replace(REGISTRY["Naive"], build=lambda *a, **k: 1 / 0))
        with pytest.raises(SystemExit, match="ZeroDivisionError"):
            main([*both, "--k", "3"])
    assert (tmp_path / "run" / "attempt" / "runs" / "CoLoR_seed0.json").exists()
    resumed = main([*both, "--resume"])  # the original settings: the completed comparison, not the attempt
    assert [run["accuracy_matrix"] for run in resumed["runs"]] == [run["accuracy_matrix"] for run in first["runs"]]
    assert not (tmp_path / "run" / "attempt").exists()


def test_progress_inside_a_run_names_experience_epoch_and_iteration_with_an_eta_and_quiet_hides_it(
        tiny_backbone, tmp_path, capsys):
    main([arg for arg in flags(tiny_backbone, tmp_path, "--epochs", "2") if arg != "--quiet"])
    shown = capsys.readouterr().err
    for experience in range(1, 6):  # digits_class: five experiences
        assert f"CoLoR seed 0: experience {experience}/5" in shown
    assert "epoch 1/2" in shown and "epoch 2/2" in shown
    assert re.search(r"experience 1/5: +\d+%\|.*\| \d+/\d+ \[\d\d:\d\d<\d\d:\d\d", shown)  # iterations, ETA
    main(flags(tiny_backbone, tmp_path, "--epochs", "2", "--name", "quiet"))
    quiet = capsys.readouterr().err
    assert "experience 1/5" not in quiet and "runs:" not in quiet


# ---------------------------------------------------------------------- issue 51: loader workers, TF32


@pytest.mark.parametrize("device, cpus, processes, batches, expected", [
    ("cpu", 16, 1, None, 0),        # the model's threads use every core
    ("cuda", 16, 1, None, 8),       # the machine: 15 CPUs left, at most 8
    ("cuda", 16, 1, 10, 3),         # a 10-batch epoch: one worker per 4 batches
    ("cuda", 16, 1, 1000, 8),
    ("cuda", 16, 4, 1000, 3),       # four torchrun processes share the node
    ("cuda", 2, 1, 1000, 1),
])
def test_the_default_loader_workers_fit_the_machine_and_the_data(device, cpus, processes, batches, expected):
    from avalanche_color.runner.config import default_workers

    assert default_workers(device, cpu_count=cpus, processes_per_node=processes, batches=batches) == expected


def test_a_comparison_runs_under_its_matmul_precision_records_it_and_restores_the_processs(monkeypatch, tmp_path):
    from avalanche_color.runner import RunConfig, RunConfigError, comparison
    from avalanche_color.runner.config import config_record

    seen = []
    monkeypatch.setattr(comparison, "prepare", lambda config: None)
    monkeypatch.setattr(comparison, "compare",
                        lambda config, ready, progress: seen.append(torch.get_float32_matmul_precision()) or {})
    before = torch.get_float32_matmul_precision()
    config = RunConfig(benchmark="digits_class", methods=("CoLoR",), out=tmp_path, matmul_precision="high")
    comparison.run_comparison(config, progress=False)
    assert seen == ["high"] and torch.get_float32_matmul_precision() == before
    assert config_record(config)["matmul_precision"] == "high"
    assert config_record(RunConfig(benchmark="digits_class", methods=("CoLoR",)))["matmul_precision"] == "highest"
    with pytest.raises(RunConfigError, match="matmul_precision must be one of"):
        RunConfig(benchmark="digits_class", methods=("CoLoR",), matmul_precision="tf32")
