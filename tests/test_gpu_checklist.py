"""The GPU checklist (benchmarks.gpu_checklist) runs on a CPU as a dry run: every step listed, the sync count made."""

from __future__ import annotations

import json
import re
import sys
import tarfile

import pytest

from benchmarks import gpu_checklist


def test_the_checklist_runs_as_a_dry_run_on_cpu(tmp_path, one_thread, monkeypatch):
    # The command of the GPU run, dry: every step's command built and its flags checked against its --help,
    # the sync count made on one strategy, the summary and the archive written.
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "requirements.txt").write_text("avalanche-color==0.1.0\n")
    out = tmp_path / "gpu-checklist"
    monkeypatch.chdir(tmp_path)  # folders given relative to where it runs, as on a node
    text = gpu_checklist.main(["--device", "cpu", "--dry-run", "--out", "gpu-checklist", "--wheelhouse", "wheelhouse",
                               "--data", "PACS.zip"])
    assert (out / "checklist.md").read_text() == text
    with tarfile.open(tmp_path / "gpu-checklist.tar.gz") as archive:
        assert {"gpu-checklist/checklist.md", "gpu-checklist/syncs.md"} <= set(archive.getnames())
    status = dict(re.findall(r"^\| ([\w-]+) \| ([^|]+) \|", text, flags=re.M))
    assert status["environment"] == "done" and status["syncs"] == "exit 0"
    for step in ("install", "cuda-tests", "perf", "pacs", "torchrun"):
        assert status[step] == "dry run: flags checked", (step, status[step])
    rows = [line.split(" | ") for line in (out / "syncs.md").read_text().splitlines() if line.startswith("| CoLoR |")]
    assert [row[1] for row in rows] == ["32-true"]
    most_per_step, most_per_batch = (int(cell.split(",")[0]) for cell in rows[0][2:4])
    assert most_per_step <= 1 and most_per_batch <= 3  # the budgets of tests/test_host_syncs.py
    for expected in ("python -m benchmarks.wheelhouse install --wheelhouse", "-m pytest -m cuda",
                     "benchmarks.perf.step --device cpu --matmul-precision high", "--only kernels", "--only memory",
                     "--bf16", "--benchmark pacs --methods CoLoR SD-LoRA", "--data PACS.zip", "--precision bf16-mixed",
                     "AVALANCHE_COLOR_BACKEND=nccl", "--nproc_per_node=2"):
        assert expected in text, expected
    assert str(tmp_path) not in text and "--out gpu-checklist/perf-tf32.md" in text  # folders as given


def test_an_unknown_flag_in_a_step_is_found():
    command = [sys.executable, "-m", "benchmarks.perf.step", "--device", "cpu", "--no-such-flag"]
    runner = [sys.executable, "-m", "avalanche_color.runner", "compare", "--benchmark", "pacs", "--nor-this"]
    assert gpu_checklist.unknown_flags([command, runner]) == {"benchmarks.perf.step": ["--no-such-flag"],
                                                              "avalanche_color.runner/compare": ["--nor-this"]}


def test_the_summary_reads_r1_r3_r4_and_the_pacs_accuracies(tmp_path):
    (tmp_path / "perf.log").write_text(
        "code: x; vit, 64 experts, device cuda, 1 threads, 3 rounds, float32, matmul precision high\n"
        "R1 (CoLoR training step / frozen-backbone forward): 2.10 (2.00-2.20)\n")
    (tmp_path / "perf-tf32.md").write_text("| row | what | segments | gathered | target |\n|---|---|---|---|---|\n"
                                           "| R3 | routed / plain | 0.48 (0.47-0.49) | 0.5 | >= 0.45 |\n"
                                           "| R4 | 10 / 1 | 1.02 (1.00-1.05) | 1.0 | <= 1.15 |\n")
    text = gpu_checklist.perf_text(tmp_path)
    assert ("| tf32 (32-true, matmul high) | 2.10 (2.00-2.20) | segments 0.48 (0.47-0.49), gathered 0.5 | "
            "segments 1.02 (1.00-1.05), gathered 1.0 |") in text
    assert "| fp32 (32-true, matmul highest) | - | - | - |" in text
    for precision, accuracy in (("32-true", 0.61), ("bf16-mixed", 0.6)):
        (tmp_path / "pacs" / precision).mkdir(parents=True)
        runs = [{"label": "CoLoR", "average_accuracy": accuracy, "wall_seconds": 30.0}]
        (tmp_path / "pacs" / precision / "results.json").write_text(json.dumps({"runs": runs}))
    assert "| CoLoR | 0.610 (30 s) | 0.600 (30 s) |" in gpu_checklist.pacs_text(tmp_path)


def test_the_checklist_refuses_unknown_options(capsys):
    with pytest.raises(SystemExit):
        gpu_checklist.main(["--device", "tpu"])
    assert "--device must be cpu, cuda or cuda:N, got 'tpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_checklist.main(["--device", "cpu", "--strategies", "Naive"])
    assert "--strategies must be among" in capsys.readouterr().err


TEST_ONLY = ("nbformat", "nbclient", "loralib", "ipykernel", "mkdocs", "peft", "pytest_timeout")
HIDE_TEST_ONLY = f"""
import sys, pytest
class Hide:  # what an environment with the runtime dependencies and pytest alone lacks
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {TEST_ONLY!r}:
            raise ModuleNotFoundError("hidden: " + name, name=name)
sys.meta_path.insert(0, Hide())
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_the_cuda_tests_collect_with_the_runtime_dependencies_and_pytest_alone():
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    run = subprocess.run([sys.executable, "-c", HIDE_TEST_ONLY, "-m", "cuda", "--collect-only", "-q",
                          "-p", "no:cacheprovider", str(tests)], cwd=tests.parent, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert any("test_two_gpus_under_nccl_match_the_gloo_run" in line for line in collected)
    assert any("bit_identical_on_cuda_under_deterministic_algorithms" in line for line in collected)
    assert all("cuda" in line.lower() or "gpu" in line.lower() for line in collected), collected
