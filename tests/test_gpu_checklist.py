"""The GPU checklist (benchmarks.gpu_checklist) runs on a CPU as a dry run: every step listed, the sync count made."""

from __future__ import annotations

import pytest

from benchmarks import gpu_checklist


def test_the_checklist_runs_as_a_dry_run_on_cpu(tmp_path, one_thread):
    text = gpu_checklist.main(["--device", "cpu", "--dry-run", "--out", str(tmp_path), "--strategies", "CoLoR"])
    assert (tmp_path / "checklist.md").read_text() == text
    syncs = (tmp_path / "syncs.md").read_text()
    rows = [line.split(" | ") for line in syncs.splitlines() if line.startswith("| CoLoR |")]
    assert [row[1] for row in rows] == ["32-true", "bf16-mixed"]
    for row in rows:
        most_per_step, most_per_batch = (int(cell.split(",")[0]) for cell in row[2:4])
        assert most_per_step <= 1 and most_per_batch <= 3  # the budgets of tests/test_host_syncs.py
    # Every step's command is listed, those not run are said so.
    for expected in ("-m benchmarks.perf --device cpu", "--bf16", "AVALANCHE_COLOR_BACKEND=nccl",
                     "--nproc_per_node=2 -m avalanche_color.runner compare", "-m pytest -m cuda"):
        assert expected in text
    assert text.count("Not run (dry run)") == 2 and "not run (dry run)" in text


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
