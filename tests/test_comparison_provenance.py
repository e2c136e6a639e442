"""--resume reuses a folder's runs only when the same settings, weights and code made them; a
fresh start works in an attempt folder and replaces the folder's results only when it completes."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from torch import nn

from avalanche_color.runner import RunConfig, RunConfigError
from avalanche_color.runner.provenance import check_folder, complete_attempt, provenance, start_attempt


def record(model=None, **settings):
    torch.manual_seed(0)
    config = RunConfig(benchmark="digits_class", loggers=(), **settings)
    return provenance(config, model or nn.Linear(3, 2), "cpu")


def test_what_a_run_computes_changes_the_record_and_what_selects_runs_does_not():
    base = record()
    assert record(methods=("CoLoR",), seeds=(0, 1), resume=True, command="x") == base
    assert record(epochs=3)["settings"] != base["settings"]
    assert record(color_lr=0.1)["settings"] != base["settings"]
    other_weights = nn.Linear(3, 2)
    with torch.no_grad():
        other_weights.weight.add_(1e-6)
    assert record(other_weights)["backbone"] != base["backbone"]


def test_resume_continues_the_same_settings_and_refuses_others_naming_the_setting_and_the_fix(tmp_path):
    attempt = start_attempt(tmp_path, record(epochs=2), resume=False)
    (attempt / "runs" / "CoLoR_seed0.json").write_text("{}")
    check_folder(tmp_path, record(epochs=2), resume=True)  # the same: continued
    assert start_attempt(tmp_path, record(epochs=2), resume=True) == attempt
    assert (attempt / "runs" / "CoLoR_seed0.json").exists()
    with pytest.raises(RunConfigError, match=r"made with other settings: epochs 2 \(now 3\); run without --resume .* "
                                             "or pass another --name") as refused:
        check_folder(tmp_path, record(epochs=3), resume=True)
    assert refused.value.field == "resume"
    with pytest.raises(RunConfigError, match=r"other settings: color_lr 0.05 \(now 0.1\), epochs 2 \(now 3\), "
                                             r"threads \d+ \(now 99\);"):
        check_folder(tmp_path, {**record(epochs=3, color_lr=0.1), "threads": 99}, resume=True)


def test_resume_refuses_runs_that_do_not_say_what_made_them(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "CoLoR_seed0.json").write_text("{}")
    with pytest.raises(RunConfigError, match="do not say what produced them"):
        check_folder(tmp_path, record(), resume=True)


def test_a_fresh_start_leaves_the_folder_as_it_was_until_it_completes_then_replaces_its_runs(tmp_path):
    earlier = {"runs/CoLoR_seed0.json": "old", "checkpoints/CoLoR_seed0.ckpt": "old", "logs/CoLoR_seed0/log.txt": "old",
               "logs/Naive_seed0/log.txt": "kept", "results.json": "old"}
    for name, text in earlier.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    check_folder(tmp_path, record(), resume=False)
    attempt = start_attempt(tmp_path, record(), resume=False)
    assert all((tmp_path / name).read_text() == text for name, text in earlier.items())  # nothing changed yet
    (attempt / "runs" / "CoLoR_seed1.json").write_text("new")
    (attempt / "logs" / "CoLoR_seed0").mkdir(parents=True)
    (attempt / "logs" / "CoLoR_seed0" / "log.txt").write_text("new")
    complete_attempt(tmp_path, attempt)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["CoLoR_seed1.json", "provenance.json"]
    assert json.loads((tmp_path / "runs" / "provenance.json").read_text()) == record()
    assert not (tmp_path / "checkpoints").exists() and not attempt.exists()
    assert (tmp_path / "logs" / "CoLoR_seed0" / "log.txt").read_text() == "new"
    assert (tmp_path / "logs" / "Naive_seed0" / "log.txt").read_text() == "kept"


def test_resuming_a_completed_comparison_carries_its_runs_and_tuning_trials_into_the_attempt(tmp_path):
    attempt = start_attempt(tmp_path, record(), resume=False)
    (attempt / "tuning" / "runs").mkdir(parents=True)
    (attempt / "tuning" / "runs" / "CoLoR_lr=0_01_seed0.json").write_text("trial")
    complete_attempt(tmp_path, attempt)
    assert (tmp_path / "tuning" / "runs" / "CoLoR_lr=0_01_seed0.json").read_text() == "trial"
    (tmp_path / "runs" / "CoLoR_seed0.json").write_text("{}")
    attempt = start_attempt(tmp_path, record(), resume=True)
    assert (attempt / "runs" / "CoLoR_seed0.json").read_text() == "{}"
    assert (attempt / "tuning" / "runs" / "CoLoR_lr=0_01_seed0.json").read_text() == "trial"


def test_the_machine_line_names_the_vector_instructions_of_torchs_cpu_kernels():
    """Machines of one CPU family that differ in them (AVX2, AVX512) sum floats in another order: a results
    file says which made it."""
    from avalanche_color.runner.provenance import describe_machine

    line = describe_machine("cpu")
    assert line.startswith("cpu: ") and f"{torch.backends.cpu.get_cpu_capability()})" in line
    assert f"{torch.get_num_threads()} thread" in line and line.endswith(f"torch {torch.__version__}")


def test_an_attempt_holding_only_tuning_trials_is_refused_under_other_settings_never_set_aside(tmp_path):
    attempt = start_attempt(tmp_path, record(epochs=2), resume=False)
    (attempt / "tuning" / "runs").mkdir(parents=True)
    (attempt / "tuning" / "runs" / "CoLoR_lr=0_01_seed0.json").write_text("{}")
    with pytest.raises(RunConfigError, match=r"other settings: epochs 2 \(now 3\)"):
        check_folder(tmp_path, record(epochs=3), resume=True)
    assert start_attempt(tmp_path, record(epochs=2), resume=True) == attempt
    assert (attempt / "tuning" / "runs" / "CoLoR_lr=0_01_seed0.json").exists()  # its trials are kept


def test_results_name_the_git_commit_of_the_code_and_whether_it_was_changed(tmp_path):
    from avalanche_color.runner.provenance import code_commit

    package = tmp_path / "repo" / "package"
    package.mkdir(parents=True)
    (package / "module.py").write_text("x = 1\n")
    assert code_commit(package) is None  # not in a git work tree (an installed wheel)

    def git(*arguments: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path / "repo"), "-c", "user.name=t", "-c", "user.email=t@t",
                               *arguments], capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    assert code_commit(package) == git("rev-parse", "HEAD")
    (tmp_path / "repo" / "elsewhere.py").write_text("y = 2\n")  # outside the package: not its code
    git("add", "elsewhere.py")
    assert code_commit(package) == git("rev-parse", "HEAD")
    (package / "module.py").write_text("x = 2\n")
    assert code_commit(package) == git("rev-parse", "HEAD") + "+changes"
