"""Issue 39, point 7: W&B panels are not duplicated, and the run folder W&B prints still exists afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest
from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics
from avalanche.training.plugins import EvaluationPlugin

from avalanche_color import CoLoR, WandBLogger
from offline_wandb import history_by_step, offline_run_file, offline_wandb  # noqa: F401 (fixture)
from streams import class_stream, tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")


def logged_names(root: Path, *metrics) -> set[str]:
    logger = WandBLogger(project_name="avalanche-color-test", dir=str(root), save_code=False)
    evaluator = EvaluationPlugin(accuracy_metrics(experience=True, stream=True), *metrics, loggers=[logger])
    strategy = CoLoR(tiny_vit(0), rank=2, k=2, lr=0.05, train_epochs=1, train_mb_size=16, evaluator=evaluator)
    benchmark = class_stream(num_experiences=2, per_class=6)
    for experience in benchmark.train_stream:
        strategy.train(experience)
        strategy.eval(benchmark.test_stream)
    logger.close()
    return {name for row in history_by_step(offline_run_file(root)).values() for name in row}


def test_avalanches_forgetting_metrics_are_not_logged_twice(offline_wandb):
    names = logged_names(offline_wandb / "with", forgetting_metrics(experience=True, stream=True))
    assert any(name.startswith("ExperienceForgetting/") for name in names)
    assert any(name.startswith("StreamForgetting/") for name in names)
    assert not any(name.startswith("Forgetting_") for name in names), sorted(names)


def test_without_avalanches_forgetting_metrics_the_logger_logs_forgetting_itself(offline_wandb):
    names = logged_names(offline_wandb / "without")
    assert "Forgetting_Stream/test_stream" in names and "Forgetting_Exp/test_stream/Exp000" in names


def test_the_run_folder_wandb_prints_exists_after_the_comparison(tiny_backbone, tmp_path, offline_wandb, monkeypatch):
    import avalanche_color.runner.run as run_module
    from avalanche_color.runner import RunConfig
    from avalanche_color.runner.comparison import run_comparison

    folders = []
    made = run_module.wandb_logger

    def recording(*args, **kwargs):
        logger = made(*args, **kwargs)
        folders.append(Path(logger.run.dir))  # "Run data is saved locally in ..." names its parent
        return logger

    monkeypatch.setattr(run_module, "wandb_logger", recording)
    config = RunConfig(benchmark="digits_class", methods=("CoLoR",), epochs=1, batch_size=64, backbone=tiny_backbone,
                       out=tmp_path / "out", ranks=(2,), loggers=(), wandb_project="avalanche-color-test")
    run_comparison(config, progress=False)
    assert len(folders) == 1 and folders[0].is_dir() and "attempt" not in folders[0].parts
    assert folders[0].is_relative_to(tmp_path / "out" / "wandb")
