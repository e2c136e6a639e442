"""The W&B logger, offline: what CoLoR's evaluation returns is what the run's history holds."""

from __future__ import annotations

import math

import pytest
import torch
import wandb
from avalanche.benchmarks import tensors_benchmark
from avalanche.evaluation.metrics import accuracy_metrics, confusion_matrix_metrics, loss_metrics
from avalanche.logging import WandBLogger as AvalancheWandBLogger
from avalanche.training.plugins import EvaluationPlugin

from PIL import Image

from avalanche_color import CoLoR, WandBLogger, routing_accuracy_metrics
from offline_wandb import (exit_code, history_by_step, logged_file, logged_table, offline_run_file,  # noqa: F401
                           offline_wandb, run_config, summary)
from streams import class_stream, tiny_vit

CONFUSION_MATRIX = "W&BConfusionMatrix_Stream/eval_phase/test_stream"


def test_logged_accuracies_and_steps_match_the_evaluation(offline_wandb):
    benchmark = class_stream(num_experiences=2, per_class=8)
    logger = WandBLogger(project_name="avalanche-color-test", run_name="tiny", dir=str(offline_wandb),
                         config={"rank": 4}, save_code=False, params={"group": "tests", "job_type": "color"})
    evaluator = EvaluationPlugin(accuracy_metrics(epoch=True, experience=True, stream=True),
                                 confusion_matrix_metrics(stream=True, wandb=True), loggers=[logger])
    strategy = CoLoR(tiny_vit(0), rank=4, k=2, lr=0.05, train_epochs=2, train_mb_size=16, eval_mb_size=64,
                     evaluator=evaluator)
    evaluations = []
    for trained, experience in enumerate(benchmark.train_stream):
        strategy.train(experience)
        results = strategy.eval(benchmark.test_stream[: trained + 1])
        evaluations.append((strategy.clock.train_iterations, results))
    run_id = logger.run.id
    assert logger.init_kwargs["id"] == run_id, "the run id wandb chose is not kept for resuming"
    logger.close()
    assert wandb.run is None, "close() left the logger's own run active"

    run_file = offline_run_file(offline_wandb)
    assert run_file.name == f"run-{run_id}.wandb"
    assert exit_code(run_file) == 0
    history = history_by_step(run_file)
    for step, results in evaluations:
        accuracies = {name: value for name, value in results.items() if name.startswith("Top1_Acc_")}
        assert any(name.startswith("Top1_Acc_Exp/") for name in accuracies)
        assert any(name.startswith("Top1_Acc_Stream/") for name in accuracies)
        assert step in history, f"nothing logged at Avalanche's step {step}; steps: {sorted(history)}"
        logged = {name: history[step].get(name) for name in accuracies}
        assert logged == pytest.approx(accuracies, rel=1e-12, abs=0)
        assert any(key.startswith(f"{CONFUSION_MATRIX}_table") for key in history[step]), "no confusion matrix"
    assert history[evaluations[0][0]]["TrainingExperience"] == 0
    assert history[evaluations[1][0]]["TrainingExperience"] == 1
    assert any("Top1_Acc_Epoch/train_phase/train_stream/Task000" in row for row in history.values())


def test_a_run_the_caller_started_is_used_and_left_open(offline_wandb):
    user_run = wandb.init(project="avalanche-color-test", dir=str(offline_wandb))
    logger = WandBLogger(project_name="ignored", dir=str(offline_wandb), save_code=False)
    assert logger.run is user_run
    logger.log_single_metric("Top1_Acc_Stream/eval_phase/test_stream/Task000", 0.5, 3)
    logger.close()
    assert wandb.run is user_run and user_run.id == logger.init_kwargs["id"]
    user_run.finish()
    assert history_by_step(offline_run_file(offline_wandb))[3]["Top1_Acc_Stream/eval_phase/test_stream/Task000"] == 0.5


def test_avalanche_logger_still_fails_to_start_with_current_wandb(offline_wandb):
    """If this fails, Avalanche's own logger works again and this module may be retired."""
    with pytest.raises(AttributeError, match="generate_id"):
        AvalancheWandBLogger(project_name="avalanche-color-test", dir=str(offline_wandb), save_code=False)
    assert wandb.run is None


def test_avalanche_logger_still_fails_to_log_with_current_wandb(offline_wandb):
    """Given a run id (so no generate_id), Avalanche's logger fails on the first metric: no wandb.viz."""
    original = AvalancheWandBLogger(project_name="avalanche-color-test", dir=str(offline_wandb), save_code=False,
                                    params={"id": "avalanche0"})
    with pytest.raises(AttributeError, match="viz"):
        original.log_single_metric("Top1_Acc_Stream/eval_phase/test_stream/Task000", 0.5, 0)


# ------------------------------------------------------------- what a run holds beyond the metrics


def misrouted_stream():
    """Three experiences of two classes each. Half of the last test experience's images are the first
    experience's, labelled with the last one's classes: the router sends them to the first expert,
    whose head has no logit for their class, so their loss is infinite."""
    benchmark = class_stream(num_experiences=3, per_class=12)

    def tensors(experience):
        return (torch.stack([sample[0] for sample in experience.dataset]),
                torch.tensor([sample[1] for sample in experience.dataset]))

    train = [tensors(experience) for experience in benchmark.train_stream]
    test = [tensors(experience) for experience in benchmark.test_stream]
    images, labels = test[2]
    half = len(labels) // 2
    test[2] = (torch.cat([images[:half], test[0][0][:len(labels) - half]]), labels)
    return tensors_benchmark(train, test, task_labels=[0, 0, 0])


def test_a_run_holds_the_options_the_accuracy_matrix_forgetting_routing_and_results(offline_wandb):
    benchmark = misrouted_stream()
    logger = WandBLogger(project_name="avalanche-color-test", dir=str(offline_wandb), save_code=False,
                         config={"rank": "the caller's"})
    evaluator = EvaluationPlugin(accuracy_metrics(epoch=True, experience=True, stream=True),
                                 loss_metrics(epoch=True, stream=True), *routing_accuracy_metrics(), loggers=[logger])
    strategy = CoLoR(tiny_vit(0), rank=4, k=2, lr=0.05, train_epochs=2, train_mb_size=16, eval_mb_size=64,
                     evaluator=evaluator)
    steps, results = [], []
    for experience in benchmark.train_stream:
        strategy.train(experience)
        results.append(strategy.eval(benchmark.test_stream))
        steps.append(strategy.clock.train_iterations)
    logger.close()
    run_file = offline_run_file(offline_wandb)
    history = history_by_step(run_file)

    # The strategy's options, every field of its config; the caller's own keys keep their values.
    config = run_config(run_file)
    assert config["strategy"] == "CoLoR" and config["rank"] == "the caller's"
    assert {key: config[key] for key in strategy.config.names() if key != "rank"} == {
        key: value for key, value in strategy.config.as_dict().items() if key != "rank"}

    def accuracy(after: int, experience: int) -> float:
        return results[after][f"Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp{experience:03d}"]

    for after, step in enumerate(steps):  # the matrix so far, after each training experience
        table = logged_table(run_file, history[step], "AccuracyMatrix/test_stream")
        assert [row["after training"] for row in table] == [f"exp {i}" for i in range(after + 1)]
        assert [[row[f"exp {j}"] for j in range(3)] for row in table] == [
            [accuracy(i, j) for j in range(3)] for i in range(after + 1)]
        with Image.open(logged_file(run_file, history[step], "AccuracyHeatmap/test_stream")) as heatmap:
            assert heatmap.format == "PNG" and min(heatmap.size) > 100

    last = history[steps[-1]]
    forgetting = {j: accuracy(j, j) - accuracy(2, j) for j in range(2)}
    assert {j: last[f"Forgetting_Exp/test_stream/Exp{j:03d}"] for j in range(2)} == forgetting
    assert last["Forgetting_Stream/test_stream"] == pytest.approx(sum(forgetting.values()) / 2, abs=1e-12)

    routing = logged_table(run_file, last, "Routing/test_stream")
    sizes = [len(experience.dataset) for experience in benchmark.test_stream]
    for j in range(3):
        rows = [row for row in routing if row["test experience"] == j]
        routed_right = sum(row["samples"] for row in rows if row["expert's training experience"] == j)
        assert sum(row["samples"] for row in rows) == sizes[j]
        assert {row["routing accuracy"] for row in rows} == {
            results[-1][f"RoutingAcc_Exp/eval_phase/test_stream/Task000/Exp{j:03d}"]}
        assert routed_right / sizes[j] == pytest.approx(rows[0]["routing accuracy"], abs=1e-12)
    assert results[-1]["RoutingAcc_Exp/eval_phase/test_stream/Task000/Exp002"] < 1  # the misrouted half

    final = logged_table(run_file, last, "Results/test_stream")
    assert [(row["test experience"], row["accuracy"], row["forgetting"]) for row in final] == [
        (j, accuracy(2, j), forgetting.get(j)) for j in range(3)]

    # The misrouted samples make the evaluation loss infinite: it is left out, and the summary says so.
    loss = "Loss_Stream/eval_phase/test_stream/Task000"
    assert math.isinf(results[-1][loss])
    assert all(math.isfinite(value) for row in history.values() for value in row.values()
               if isinstance(value, float))
    assert loss in summary(run_file)["skipped_non_finite"]
    assert all(math.isfinite(row["Loss_Epoch/train_phase/train_stream/Task000"]) for row in history.values()
               if "Loss_Epoch/train_phase/train_stream/Task000" in row)


def test_the_logger_prints_nothing_while_training_even_when_wandb_is_not_silenced(offline_wandb, monkeypatch,
                                                                                   capfd):
    monkeypatch.setenv("WANDB_SILENT", "false")
    benchmark = class_stream(num_experiences=2, per_class=8)
    logger = WandBLogger(project_name="avalanche-color-test", dir=str(offline_wandb), save_code=False)
    assert "Tracking run with wandb" in capfd.readouterr().err  # wandb does speak here
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True, stream=True), loss_metrics(stream=True),
                                 *routing_accuracy_metrics(), loggers=[logger])
    strategy = CoLoR(tiny_vit(0), rank=4, k=2, lr=0.05, train_epochs=1, train_mb_size=16, eval_mb_size=64,
                     evaluator=evaluator)
    for experience in benchmark.train_stream:
        strategy.train(experience)
        strategy.eval(benchmark.test_stream)
    assert capfd.readouterr() == ("", "")
    logger.close()
    assert "WARNING" not in capfd.readouterr().err  # e.g. a step logged out of order


def test_strategy_options_are_a_package_strategys_config_or_an_avalanche_strategys_sizes():
    from avalanche.training import Naive

    from avalanche_color.evaluation.wandb_logger import strategy_options

    color = CoLoR(tiny_vit(0), rank=4, k=3, evaluator=EvaluationPlugin(loggers=[]))
    assert strategy_options(color) == {"strategy": "CoLoR", **color.config.as_dict()}
    model = torch.nn.Linear(2, 2)
    naive = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_mb_size=7,
                  train_epochs=3, eval_mb_size=5, evaluator=EvaluationPlugin(loggers=[]))
    assert strategy_options(naive) == {"strategy": "Naive", "train_mb_size": 7, "train_epochs": 3, "eval_mb_size": 5}


def test_the_accuracy_matrix_takes_the_latest_evaluation_per_row_and_avalanches_forgetting():
    from avalanche_color.evaluation.metrics import AccuracyMatrix

    def acc(experience: int) -> str:
        return f"Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp{experience:03d}"

    matrix = AccuracyMatrix()
    assert not matrix.observe(acc(0), 0.1)  # before any training: no row
    matrix.start_training(0)
    assert matrix.observe(acc(0), 0.5)  # during training (a periodic evaluation) ...
    matrix.observe(acc(0), 0.9)  # ... replaced by the one after it
    matrix.start_training(1)
    matrix.observe(acc(0), 0.7)
    matrix.observe(acc(1), 0.8)
    matrix.start_training(0)  # experience 0 again
    matrix.observe(acc(0), 0.6)
    matrix.observe(acc(1), 0.4)
    assert not matrix.observe("Loss_Exp/eval_phase/test_stream/Task000/Exp000", 3.0)
    assert matrix.matrix("test_stream") == [[0.9, None], [0.7, 0.8], [0.6, 0.4]]
    # Experience 0's accuracy after its latest training is the last row itself: no forgetting counted.
    assert matrix.forgetting("test_stream") == {1: pytest.approx(0.4)}
    assert [row["forgetting"] for row in matrix.final_rows("test_stream")] == [None, pytest.approx(0.4)]


def test_periodic_evaluations_during_training_fill_the_matrix_and_results_come_at_close(offline_wandb):
    benchmark = class_stream(num_experiences=2, per_class=8)
    logger = WandBLogger(project_name="avalanche-color-test", dir=str(offline_wandb), save_code=False)
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True, stream=True), loggers=[logger])
    strategy = CoLoR(tiny_vit(0), rank=4, k=2, lr=0.05, train_epochs=2, train_mb_size=16, eval_mb_size=64,
                     eval_every=1, evaluator=evaluator)
    for experience in benchmark.train_stream:
        strategy.train(experience, eval_streams=[benchmark.test_stream])
    final = strategy.eval(benchmark.test_stream)  # what the periodic evaluation at the end also saw
    rows = logger.accuracy_matrix.matrix("test_stream")
    logger.close()
    history = history_by_step(offline_run_file(offline_wandb))
    [last] = [row for row in history.values() if "Results/test_stream/path" in row]
    table = logged_table(offline_run_file(offline_wandb), last, "AccuracyMatrix/test_stream")
    assert len(table) == 2 and [table[1][f"exp {j}"] for j in range(2)] == rows[1] == [
        final[f"Top1_Acc_Exp/eval_phase/test_stream/Task000/Exp{j:03d}"] for j in range(2)]


def test_each_kind_of_metric_value_becomes_the_wandb_object_avalanches_logger_logs():
    import numpy as np
    import torch
    import wandb
    from avalanche.evaluation.metric_results import AlternativeValues, TensorImage

    from avalanche_color.evaluation.wandb_logger import wandb_value

    image = Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8))
    assert isinstance(wandb_value(wandb, image), wandb.Image)
    assert isinstance(wandb_value(wandb, TensorImage(torch.zeros(3, 4, 4))), wandb.Image)
    assert isinstance(wandb_value(wandb, torch.arange(10.0)), wandb.Histogram)
    assert wandb_value(wandb, 0.5) == 0.5 and wandb_value(wandb, 3) == 3
    assert wandb_value(wandb, "text") is None and wandb_value(wandb, None) is None
    assert wandb_value(wandb, AlternativeValues("text", 0.25)) == 0.25  # the best value wandb supports
