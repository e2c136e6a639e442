"""The learned-and-kept table (benchmarks.reporting.diagonals) on results written by hand: the test sizes it
recovers weight the averages as the runner does, and the diagonal is what each experience scored when new."""

from __future__ import annotations

import json

import pytest

from benchmarks.reporting.diagonals import rows, experience_sizes

SIZES = [40, 25, 35]  # right answers / size gives every accuracy below


def run(label: str, seed: int, right: list[list[int]], routing=None) -> dict:
    matrix = [[count / size if count is not None else None for count, size in zip(row, SIZES)] for row in right]
    final = sum(right[-1]) / sum(SIZES)
    return {"label": label, "seed": seed, "accuracy_matrix": matrix, "average_accuracy": final,
            "routing_accuracy": routing}


def write(folder, runs) -> None:
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"runs": runs}))


def test_sizes_come_back_from_the_accuracies_and_weight_the_diagonal(tmp_path):
    runs = [run("A", 0, [[30, None, None], [28, 20, None], [26, 17, 28]], routing=0.9),
            run("A", 1, [[31, None, None], [29, 21, None], [27, 19, 29]], routing=0.8),
            run("B", 0, [[33, None, None], [20, 22, None], [11, 15, 31]])]
    assert experience_sizes(runs) == SIZES
    write(tmp_path / "a", runs[:2])
    write(tmp_path / "b", runs[2:])
    table = {row[0]: row for row in rows([tmp_path / "a", tmp_path / "b"])}
    diagonal_b = (33 + 22 + 31) / 100
    assert table["B"][2] == f"{100 * 57 / 100:.1f}" and table["B"][3] == f"{100 * diagonal_b:.1f}"
    assert table["B"][4] == f"{100 * (57 / 100 - diagonal_b):.1f}"  # what later training cost
    assert table["A"][1] == "2" and table["A"][5] == "85.0 ± 7.1" and table["B"][5] == "-"


def test_runs_of_another_split_are_refused(tmp_path):
    runs = [run("A", 0, [[30, None, None], [28, 20, None], [26, 17, 28]])]
    other = dict(runs[0], average_accuracy=runs[0]["average_accuracy"] + 0.01)  # not these sizes' average
    write(tmp_path / "a", runs + [dict(other, seed=1)])
    with pytest.raises(ValueError, match=r"do not give A seed \d's average accuracy"):
        rows([tmp_path / "a"])
