"""The README's result tables are what the committed results files say."""

import json

from benchmarks.reporting.readme import README, render, stale_blocks, updated


def test_every_readme_table_matches_its_results_file():
    text = README.read_text()
    assert "<!-- results: digits_class -->" in text and "<!-- results: digits_domain -->" in text
    assert stale_blocks(text) == []


def test_a_block_is_rewritten_from_its_results_and_a_stale_one_is_found(tmp_path):
    run = {"label": "CoLoR", "method": "CoLoR", "seed": 0, "accuracy_matrix": [[0.5]], "average_accuracy": 0.5,
           "forgetting": 0.0, "routing_accuracy": 1.0, "trainable_parameters_per_experience": 10,
           "wall_seconds": 6.0, "cpu_seconds": 6.0}
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "results.json").write_text(json.dumps(
        {"config": {"command": "python -m benchmarks.compare --benchmark toy"}, "device": "cpu: AMD EPYC (x86_64), 1 thread; torch 2.14.1",
         "runs": [run]}))
    text = "intro\n<!-- results: toy -->\nold numbers\n<!-- end results -->\noutro\n"
    assert stale_blocks(text, tmp_path) == ["toy"]
    fresh = updated(text, tmp_path)
    assert fresh.startswith("intro\n") and fresh.endswith("<!-- end results -->\noutro\n")
    assert "OMP_NUM_THREADS=1 python -m benchmarks.compare --benchmark toy" in fresh  # as it ran
    assert "| CoLoR | 1 | 50.0 |" in fresh and "Made on cpu: AMD EPYC (x86_64), 1 thread" in fresh
    assert "minutes" not in fresh  # wall time differs between runs: not in the README
    assert stale_blocks(fresh, tmp_path) == [] and render("toy", tmp_path) in fresh
