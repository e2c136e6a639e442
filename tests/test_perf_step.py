"""``python -m benchmarks.perf.step``: R1 alone, in the table's shape."""

import re
import sys

import pytest

from benchmarks.perf import step


def run_step(monkeypatch, capsys, *options: str) -> str:
    monkeypatch.setattr(sys, "argv", ["step", "--model", "vit_tiny_patch16_224", "--batch-size", "2", "--rank", "2",
                                      "--experts", "2", "--k", "2", "--threads", "1", *options])
    step.main()
    return capsys.readouterr().out


def test_one_round_s_r1_is_that_round_s_step_over_its_forward(monkeypatch, capsys):
    out = run_step(monkeypatch, capsys, "--rounds", "1")
    r1 = float(re.search(r"R1 \(.*\): ([0-9.]+)", out).group(1))
    forward = float(re.search(r"frozen-backbone forward: ([0-9.]+) s", out).group(1))
    training_step = float(re.search(r"CoLoR training step: ([0-9.]+) s", out).group(1))
    assert r1 == pytest.approx(training_step / forward, rel=0.05)  # both printed rounded
    assert r1 > 1.0  # a step is a forward and a backward through the same blocks
    assert f"code: {step.avalanche_color.__file__}" in out  # which tree was timed


def test_a_count_below_one_is_refused_by_name(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_step(monkeypatch, capsys, "--rounds", "0")
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err
