"""Short ways to run the strategies in the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import timm
import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics
from avalanche.training import Naive
from avalanche.training.plugins import EvaluationPlugin
from filelock import FileLock

from avalanche_color import CoLoR, routing_accuracy_metrics
from streams import tiny_vit



def saved_vit(path: Path, **vit_options) -> str:
    """A seeded timm ViT with ``vit_options`` (its size) saved as a backbone file at ``path``."""
    from avalanche_color.backbones import save_backbone

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **vit_options)
    save_backbone(model, path, architecture="vit_tiny_patch16_224", model_kwargs=vit_options)
    return str(path)


def stream_metric(results: dict, metric: str) -> float:
    """A stream-level metric's value (Avalanche names it after the last experience's task)."""
    [value] = [v for k, v in results.items() if k.startswith(f"{metric}_Stream/eval_phase/test_stream/")]
    return value


def quiet_evaluator() -> EvaluationPlugin:
    return EvaluationPlugin(
        accuracy_metrics(stream=True, experience=True), *routing_accuracy_metrics(), loggers=[]
    )


def tiny_color(seed: int = 0, **options) -> CoLoR:
    settings = dict(rank=4, k=3, lr=0.05, train_epochs=8, train_mb_size=16, eval_mb_size=64)
    settings.update(options)
    return CoLoR(tiny_vit(seed), evaluator=quiet_evaluator(), **settings)


# One short epoch: tiny CoLoR's accuracy on class_stream stays well below 1 (about 0.7; chance 0.25),
# so comparing two runs' accuracies can fail.
UNSATURATED = dict(train_epochs=1, lr=0.01)


def train_all(strategy, benchmark) -> dict:
    for experience in benchmark.train_stream:
        strategy.train(experience)
    return strategy.eval(benchmark.test_stream)


def naive_accuracy(benchmark, num_classes: int, seed: int = 0) -> float:
    """Final stream accuracy of fine-tuning the whole ViT, with the same settings as tiny_color."""
    model = tiny_vit(seed, num_classes=num_classes)
    strategy = Naive(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=2e-4),
        train_epochs=8,
        train_mb_size=16,
        eval_mb_size=64,
        evaluator=quiet_evaluator(),
    )
    return stream_metric(train_all(strategy, benchmark), "Top1_Acc")


class SeenLabels(SupervisedPlugin, supports_distributed=True):
    """The labels of every evaluation batch, as the metrics see them, per experience."""

    def __init__(self):
        super().__init__()
        self.labels: dict[int, list[torch.Tensor]] = {}

    def after_eval_iteration(self, strategy, **kwargs):
        self.labels.setdefault(strategy.experience.current_experience, []).append(strategy.mb_y.cpu())


class LearningRates(SupervisedPlugin):
    """The learning rate of every training iteration, by (experience, epoch), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[int, int], list[float]] = {}

    def before_training_iteration(self, strategy, **kwargs):
        key = (strategy.clock.train_exp_counter, strategy.clock.train_exp_epochs)
        self.seen.setdefault(key, []).append(strategy.optimizer.param_groups[0]["lr"])


# ---------------------------------------------------------------------- torchrun: 2 CPU ranks, launched once

TESTS = Path(__file__).parent


def run_torchrun(script: str, *arguments: str, timeout: float = 600, **environment: str) -> str:
    """``tests/<script>`` with ``arguments`` on 2 ranks under torchrun (``--standalone``), one thread each, the
    repository on their path and ``environment`` added to theirs; their standard output. A launch that fails
    fails the test with the end of their standard error."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")]), **environment}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(TESTS / script), *arguments]
    run = subprocess.run(command, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout


def once_per_session(tmp_path_factory, name: str, launch: Callable[[Path], object]) -> Path:
    """The session's folder ``name``, filled by ``launch(folder)`` for the first test that asks and read by every
    later one: starting 2 processes costs more than what they run. Under pytest-xdist the workers share it through
    a file lock in the session's temporary folder. A launch that failed fails every test that asks, with its
    message."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's own
    out = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (out / "done").exists():
            out.mkdir(exist_ok=True)
            try:
                launch(out)
            except AssertionError as failure:
                (out / "done").write_text(f"the launch failed: {failure}")
                raise
            (out / "done").write_text("")
    failure = (out / "done").read_text()
    assert not failure, failure
    return out
