"""The routing-ceiling report: its numbers by hand on made-up outputs, and on trained models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from avalanche_color.runner import run_comparison
from benchmarks.reporting.routing_ceiling import ceiling, expert_outputs, main
from helpers import stream_metric, tiny_color
from streams import class_stream
from test_compare import tiny_config

INF = float("-inf")


def test_the_report_on_outputs_worked_out_by_hand():
    # Two experts (classes 0-1 and 2-3), four samples; expert 0 owns samples 0-1, expert 1 samples 2-3.
    logits = torch.tensor([
        [[3.0, 0.0, INF, INF], [INF, INF, 1.0, 0.0]],  # label 0: expert 0 right and confident
        [[0.0, 2.0, INF, INF], [INF, INF, 0.0, 3.0]],  # label 1: expert 0 right, expert 1 more confident
        [[1.0, 0.0, INF, INF], [INF, INF, 4.0, 0.0]],  # label 2: expert 1 right and confident
        [[5.0, 0.0, INF, INF], [INF, INF, 0.0, 1.0]],  # label 3: expert 1 right, expert 0 more confident
    ])
    outputs = {"labels": torch.tensor([0, 1, 2, 3]), "right": torch.tensor([0, 0, 1, 1]),
               "routed": torch.tensor([0, 1, 1, 1]), "logits": logits,
               # pairs (expert, class) = (0,0), (0,1), (1,2), (1,3); the router prefers pair 1 everywhere
               "pair_scores": torch.tensor([[0.0, 1.0, 0.0, 0.0]]).repeat(4, 1)}
    report = ceiling(outputs, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2, 3]))
    assert report["routed accuracy"] == 0.75  # sample 1 goes to expert 1, which predicts 3
    assert report["routing accuracy"] == 0.75
    assert report["oracle accuracy"] == 1.0
    assert report["accuracy, samples routed right"] == 1.0
    assert report["accuracy, samples routed wrong"] == 0.0
    assert report["most confident expert: routing accuracy"] == 0.5  # samples 1 and 3 pick the other expert
    assert report["most confident expert: accuracy"] == 0.5
    assert report["class router: class accuracy"] == 0.25  # always class 1
    # Router posterior x expert probability (log: -0.74 for pair 1, -1.74 for the others): samples
    # 0-2 get their class (sample 1 by the router's preference), sample 3 class 0 (expert 0's 5.0).
    assert report["router x every expert: accuracy"] == 0.75
    assert "class router: class accuracy" not in ceiling({k: v for k, v in outputs.items() if k != "pair_scores"})


@pytest.mark.parametrize("router", ["prototypes", "gaussian"])
def test_routed_numbers_equal_the_strategys_metrics(router, one_thread):
    benchmark = class_stream(num_experiences=3)
    strategy = tiny_color(router=router)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    metrics = strategy.eval(benchmark.test_stream)
    model = strategy.model
    report = ceiling(expert_outputs(model, benchmark.test_stream),
                     *(() if not hasattr(model.router, "pair_experts") else (model.router.pair_experts,
                                                                   model.router.pair_classes)))
    assert report["routed accuracy"] == pytest.approx(stream_metric(metrics, "Top1_Acc"))
    assert report["routing accuracy"] == pytest.approx(stream_metric(metrics, "RoutingAcc"))
    # Class-incremental: an expert knows only its own classes, so a sample routed wrong is wrong.
    wrong = report["accuracy, samples routed wrong"]
    assert wrong == 0.0 or math.isnan(wrong)
    assert report["oracle accuracy"] >= report["routed accuracy"]
    assert ("class router: class accuracy" in report) == (router != "prototypes")


def test_the_command_reads_a_comparisons_checkpoint(tiny_backbone, tmp_path, capsys, one_thread):
    run_comparison(tiny_config(tiny_backbone, tmp_path, methods=("CoLoR-gaussian",)), progress=False)
    main([str(tmp_path), "--method", "CoLoR-gaussian", "--seed", "0"])
    printed = dict(line.rsplit(maxsplit=1) for line in capsys.readouterr().out.strip().splitlines())
    run = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    assert float(printed["routed accuracy"]) == pytest.approx(100 * run["average_accuracy"], abs=0.05)
    assert float(printed["routing accuracy"]) == pytest.approx(100 * run["routing_accuracy"], abs=0.05)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        main([str(tmp_path), "--method", "CoLoR-gaussian", "--seed", "7"])
