"""S-Prompts and L2P in the comparison runner: registered, planned for every seed, parameters counted."""

from __future__ import annotations

import pytest

from avalanche_color import L2P, SPrompts
from avalanche_color.benchmarks import benchmark_spec
from avalanche_color.runner import METHODS, RunConfig, run_comparison
from avalanche_color.runner.comparison import plan_runs
from avalanche_color.runner.run import build_method, trainable_parameters_per_experience
from streams import class_stream, tiny_vit


def test_prompt_methods_are_registered():
    assert {"S-Prompts", "L2P"} <= set(METHODS)


@pytest.mark.parametrize("method, strategy_class", [("S-Prompts", SPrompts), ("L2P", L2P)])
def test_build_strategy_uses_the_papers_prompt_sizes_and_counts_what_one_experience_trains(method, strategy_class):
    config = RunConfig(benchmark="digits_class", epochs=1, batch_size=16)
    strategy = build_method(method, config, lambda classes: tiny_vit(), 4)
    assert isinstance(strategy, strategy_class)
    strategy.train(class_stream().train_stream[0])  # two classes
    width, head = 32, 32 * 2 + 2
    expected = {
        "S-Prompts": 10 * width + head,  # one expert: 10 prompt tokens and its head
        "L2P": 10 * width + 10 * 5 * width + head,  # the shared pool (keys, 10 x 5 tokens) and head
    }
    assert trainable_parameters_per_experience(strategy) == expected[method]


def test_prompt_methods_run_for_every_seed_and_s_prompts_for_every_k(tmp_path):
    config = RunConfig(benchmark="digits_class", methods=("S-Prompts", "L2P", "Naive"), seeds=(0, 1), ks=(2, 4),
                       out=tmp_path)
    plan = [(label, seed, k) for _, label, seed, _, k in plan_runs(config, benchmark_spec("digits_class"))]
    assert plan == [("S-Prompts k=2", 0, 2), ("S-Prompts k=2", 1, 2), ("S-Prompts k=4", 0, 4),
                    ("S-Prompts k=4", 1, 4), ("L2P", 0, None), ("L2P", 1, None), ("Naive", 0, None)]


def test_runner_reports_prompt_methods_beside_color(tiny_backbone, tmp_path):
    config = RunConfig(benchmark="digits_class", methods=("CoLoR", "S-Prompts", "L2P"), epochs=1,
                       batch_size=64, backbone=tiny_backbone, out=tmp_path, ranks=(2,), loggers=())
    runs = {run["label"]: run for run in run_comparison(config, progress=False)["runs"]}
    assert list(runs) == ["CoLoR", "S-Prompts", "L2P"]
    assert runs["S-Prompts"]["k"] == 4 and runs["S-Prompts"]["routing_accuracy"] is not None
    assert runs["L2P"]["k"] is None and runs["L2P"]["routing_accuracy"] is None
    assert runs["S-Prompts"]["trainable_parameters_per_experience"] == 10 * 32 + 32 * 2 + 2
    for run in runs.values():
        assert len(run["accuracy_matrix"]) == 5 and 0.0 <= run["average_accuracy"] <= 1.0
    assert "| L2P | 1 | " in (tmp_path / "summary.md").read_text()
