"""The reproduction check: a fresh comparison against the committed one, row by row, within the spread."""

from __future__ import annotations

import json

import pytest

from benchmarks.reporting.reproduce import TOLERANCE, compare_rows, main


def runs(label: str, accuracies: list[float], forgetting: float = 0.1) -> list[dict]:
    return [{"label": label, "seed": seed, "average_accuracy": a, "forgetting": forgetting}
            for seed, a in enumerate(accuracies)]


def test_a_row_agrees_within_two_spreads_and_differs_beyond():
    committed = runs("CoLoR", [0.90, 0.92, 0.94])  # std 2 points
    near = runs("CoLoR", [0.93, 0.95, 0.97])  # mean 3 points higher: 1.5 spreads
    far = runs("CoLoR", [0.95, 0.97, 0.99])  # 5 points: 2.5 spreads
    [accuracy, _] = compare_rows(near, committed)
    assert accuracy["agrees"] and accuracy["metric"] == "average accuracy" and "+1.5 x" in accuracy["why"]
    assert not compare_rows(far, committed)[0]["agrees"]
    assert TOLERANCE == 2.0


def test_a_missing_method_and_single_seeds_are_judged_strictly():
    [accuracy, forgetting] = compare_rows(runs("Naive", [0.5]), runs("CoLoR", [0.9, 0.92]))
    assert not accuracy["agrees"] and accuracy["why"] == "no fresh run"
    one_each = compare_rows(runs("CoLoR", [0.9]), runs("CoLoR", [0.91]))
    assert not one_each[0]["agrees"] and one_each[1]["agrees"]  # 1 point apart; equal forgetting


def test_the_command_exits_1_when_a_row_differs(tmp_path, capsys):
    for folder, accuracies in (("fresh", [0.90, 0.92]), ("committed", [0.90, 0.92])):
        (tmp_path / folder / "digits_class").mkdir(parents=True)
        (tmp_path / folder / "digits_class" / "results.json").write_text(
            json.dumps({"runs": runs("CoLoR", accuracies) + runs("Naive", [0.3, 0.5])}))
    arguments = ["digits_class", "--fresh", str(tmp_path / "fresh"), "--committed", str(tmp_path / "committed")]
    with pytest.raises(SystemExit) as exit:
        main(arguments)
    assert exit.value.code == 0 and "every row agrees" in capsys.readouterr().out
    (tmp_path / "fresh" / "digits_class" / "results.json").write_text(json.dumps({"runs": runs("CoLoR", [0.5, 0.52])}))
    with pytest.raises(SystemExit) as exit:
        main(arguments)
    output = capsys.readouterr().out
    assert exit.value.code == 1 and "3 row(s) differ" in output and "DIFFERS" in output
