"""The budget curves: points read from a folder of comparisons (finished or running), their tables and plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.reporting import budget_curves
from benchmarks.reporting.budget_curves import markdown, metric_table, points

# Two test experiences of 4 samples each: every accuracy is a whole number of right answers out of 4.
LEARNED = [[0.5, None], [0.25, 0.75]]  # diagonal (0.5 + 0.75) / 2, final (0.25 + 0.75) / 2


def run(method, seed=0, rank=None, lr=0.01, matrix=LEARNED, routing=None):
    return {"label": method, "method": method, "seed": seed, "rank": rank, "lr": lr, "accuracy_matrix": matrix,
            "average_accuracy": sum(matrix[-1]) / 2, "routing_accuracy": routing, "lr_chosen_by": "--tune lr: rule",
            "cpu_seconds": 1800.0}


def comparison(folder: Path, name: str, epochs: int, runs, finished: bool = True) -> None:
    settings = {"epochs": epochs, "train_per_class": None}
    if finished:
        (folder / name).mkdir(parents=True)
        (folder / name / "results.json").write_text(json.dumps({"config": settings, "runs": runs}))
        return
    attempt = folder / name / "attempt" / "runs"
    attempt.mkdir(parents=True)
    (attempt / "provenance.json").write_text(json.dumps({"settings": settings}))
    for number, record in enumerate(runs):
        (attempt / f"run{number}.json").write_text(json.dumps(record))


@pytest.fixture
def budget(tmp_path) -> Path:
    comparison(tmp_path, "e02_color", 2, [run("CoLoR", rank=64, routing=0.5), run("CoLoR", rank=8, routing=0.5)])
    comparison(tmp_path, "e05_color", 5, [run("CoLoR", rank=64, matrix=[[0.75, None], [0.75, 1.0]], routing=1.0,
                                              seed=seed) for seed in (0, 1)] +
               [run("NCM", lr=None, matrix=[[0.5, None], [0.5, 0.5]])])
    comparison(tmp_path, "e05_s_prompts", 5, [run("S-Prompts", routing=0.75)], finished=False)
    return tmp_path


def test_each_method_rank_and_budget_is_a_point_and_a_running_comparison_counts_its_runs_so_far(budget):
    found = {(point.line, point.epochs): point for point in points(budget)}
    assert set(found) == {("CoLoR r=64", 2), ("CoLoR r=8", 2), ("CoLoR r=64", 5), ("NCM", None), ("S-Prompts", 5)}
    assert found[("CoLoR r=64", 2)].diagonal == (0.625,) and found[("CoLoR r=64", 2)].final == (0.5,)
    assert found[("CoLoR r=64", 5)].seeds == (0, 1) and found[("CoLoR r=64", 5)].cpu_seconds == 3600
    assert not found[("S-Prompts", 5)].finished and found[("CoLoR r=64", 5)].finished


def test_the_tables_give_a_column_per_budget_a_level_for_training_free_methods_and_mark_what_runs(budget):
    table = metric_table(points(budget), "final").splitlines()
    assert table[0] == "| method | 2 epochs | 5 epochs |"
    assert table[2:] == ["| CoLoR r=64 | 50.0 | 87.5 ± 0.0 |", "| CoLoR r=8 | 50.0 |  |",
                         "| S-Prompts |  | 50.0* |", "| NCM | 50.0 | 50.0 |"]  # the runner's order of methods
    routing = metric_table(points(budget), "routing")
    assert "NCM" not in routing and "| CoLoR r=64 | 50.0 | 100.0 ± 0.0 |" in routing
    page = markdown(points(budget), "pacs")
    assert "`*`: a comparison still running" in page and "| e05_s_prompts (running) |" in page
    assert "CPU time of every run above: 3.0 h." in page


def test_a_variant_evaluated_on_colors_experts_says_so_beside_its_cpu_time(tmp_path):
    oracle = {**run("CoLoR-oracle", rank=64, routing=1.0), "trained_by": "CoLoR", "cpu_seconds": 36.0}
    comparison(tmp_path, "e20_color_routers", 20, [run("CoLoR", rank=64, routing=0.5), oracle])
    table = markdown(points(tmp_path), "pacs")
    assert "| CoLoR-oracle r=64 | 20 | all | 0 | 0.01 | --tune lr | 0.01 (evaluated on CoLoR's experts) |" in table
    assert "| CoLoR r=64 | 20 | all | 0 | 0.01 | --tune lr | 0.50 |" in table


def test_a_point_measured_again_is_shown_once_and_checked_against_the_first(tmp_path):
    comparison(tmp_path, "e20_color", 20, [run("CoLoR", rank=64)])
    comparison(tmp_path, "e20_color_routers", 20, [run("CoLoR", rank=64, matrix=[[0.5, None], [0.5, 0.75]]),
                                                    run("CoLoR-oracle", rank=64)])
    found = points(tmp_path)
    assert metric_table(found[:1] + found[2:], "final") == metric_table(budget_curves.first_measured(found), "final")
    assert "| CoLoR r=64 | 50.0 |" in metric_table(budget_curves.first_measured(found), "final")
    page = markdown(found, "pacs")
    assert "| CoLoR r=64 | 20 | e20_color | 50.0 | e20_color_routers | 62.5 | +12.50 |" in page
    assert "| CoLoR-oracle r=64 | 20 |" not in page.split("## Points measured again")[1]


def test_the_command_writes_the_page_and_the_plot_and_refuses_an_empty_folder(budget, tmp_path, capsys):
    budget_curves.main([str(budget)])
    assert (budget / "budget.md").read_text().startswith("# ")
    assert (budget / "budget.png").read_bytes()[:4] == b"\x89PNG"
    assert "| CoLoR r=64 | 50.0 | 87.5 ± 0.0 |" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="no comparison under"):
        points(tmp_path / "empty")


def test_a_pages_budget_block_is_written_from_the_finished_points_and_a_stale_one_is_found(budget):
    from benchmarks.reporting.readme import stale_blocks, updated

    page = f"Before.\n<!-- budget: {budget.name} -->\nold\n<!-- end budget -->\nAfter.\n"
    fresh = updated(page, results=budget.parent)
    assert fresh.startswith("Before.\n") and fresh.endswith("<!-- end budget -->\nAfter.\n")
    assert f"python -m benchmarks.reporting.budget_curves benchmarks/results/{budget.name}" in fresh
    assert "| CoLoR r=64 | 50.0 | 87.5 ± 0.0 |" in fresh and "| NCM | 50.0 | 50.0 |" in fresh
    assert "S-Prompts" not in fresh  # its comparison is still running: the pages show finished points only
    assert stale_blocks(page, results=budget.parent) == [f"budget: {budget.name}"]
    assert stale_blocks(fresh, results=budget.parent) == []
