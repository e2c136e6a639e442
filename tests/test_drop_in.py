"""Issue 14: CoLoR, S-Prompts and L2P are drop-ins for real Avalanche scripts.

Wherever Avalanche's Naive runs (its stream generators, periodic evaluation,
early stopping, its plugins, loggers and metrics), the three strategies must
run and LEARN (final stream accuracy clearly above chance), or refuse a plugin
they cannot honour when they are built, with a message naming it.

Everything runs a seeded tiny timm ViT on a tiny, clearly separable synthetic
stream (4 classes, 2 experiences; see drop_in_cases.py), a few seconds a case
on one CPU thread. Naive runs the same situations where cheap, to show each is
valid Avalanche (fine-tuning forgets in class-incremental streams, so Naive is
only asked to beat chance by a little).
"""

from __future__ import annotations

import csv
import io
import math
import re
import warnings

import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import (
    accuracy_metrics,
    bwt_metrics,
    confusion_matrix_metrics,
    cpu_usage_metrics,
    disk_usage_metrics,
    forgetting_metrics,
    forward_transfer_metrics,
    loss_metrics,
    ram_usage_metrics,
    timing_metrics,
)
from avalanche.logging import CSVLogger, TextLogger
from avalanche.training.plugins import (
    EarlyStoppingPlugin,
    EvaluationPlugin,
    EWCPlugin,
    GDumbPlugin,
    LRSchedulerPlugin,
    LwFPlugin,
    ReplayPlugin,
    SynapticIntelligencePlugin,
)

from avalanche_color import L2P, CoLoR, SPrompts, routing_accuracy_metrics
from drop_in_cases import (
    CHANCE,
    LEARNED,
    NUM_CLASSES,
    ROUTED,
    SETTINGS,
    STRATEGIES,
    STREAMS,
    TASK_LABELLED,
    UNLABELLED,
    build,
    build_naive,
    is_finite,
    metric_stream_name,
    nc,
    quiet_evaluator,
    stream_accuracy,
    train_stream_and_eval,
)

WITH_NAIVE = ("Naive", *STRATEGIES)
NAIVE_LEARNED = CHANCE + 0.15  # Naive forgets the first experience's classes in class-incremental streams


@pytest.fixture(autouse=True)
def one_quiet_thread():
    """Tiny models run fastest on one thread (and the machine may be busy); no logger warnings."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        warnings.filterwarnings("ignore", message=".*EarlyStopping.*")
        yield
    torch.set_num_threads(threads)


def make(name: str, **options):
    """Naive or one of the three strategies, tiny settings."""
    return build_naive(**options) if name == "Naive" else build(name, **options)


def learned(name: str) -> float:
    return NAIVE_LEARNED if name == "Naive" else LEARNED


def assert_learns(name: str, accuracy: float) -> None:
    assert accuracy > learned(name), f"{name}: final stream accuracy {accuracy:.3f}, chance {CHANCE}"


def recorded_stream_accuracies(strategy, stream) -> list[float]:
    """Every stream accuracy on ``stream`` recorded so far (periodic evaluations included), oldest first."""
    prefix = f"Top1_Acc_Stream/eval_phase/{metric_stream_name(stream)}"
    series = [values for key, (_, values) in strategy.evaluator.get_all_metrics().items()
              if key == prefix or key.startswith(prefix + "/")]
    assert len(series) == 1, f"expected one {prefix} series"
    return [float(v) for v in series[0]]


class LossRecorder(SupervisedPlugin):
    """Every training loss, and the learning rate of each training iteration by (experience, epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.lrs: dict[tuple[int, int], list[float]] = {}
        self.iterations: dict[int, int] = {}

    def before_training_iteration(self, strategy, **kwargs):
        key = (strategy.clock.train_exp_counter, strategy.clock.train_exp_epochs)
        self.lrs.setdefault(key, []).append(strategy.optimizer.param_groups[0]["lr"])
        experience = strategy.experience.current_experience
        self.iterations[experience] = self.iterations.get(experience, 0) + 1

    def after_training_iteration(self, strategy, **kwargs):
        self.losses.append(float(strategy.loss))


def learns_or_refuses(name: str, plugin, benchmark, **options) -> str:
    """Either the strategy refuses ``plugin`` when it is built, with a message naming the plugin's
    class, or it trains the whole stream with it and learns. Anything else fails: another
    exception at construction, any exception in training or evaluation, a non-finite training loss."""
    plugin_name = type(plugin).__name__
    recorder = LossRecorder()
    try:
        strategy = make(name, plugins=[plugin, recorder], **options)
    except Exception as error:  # noqa: BLE001 - the message decides
        if plugin_name not in str(error):
            raise AssertionError(f"{name} failed to build with {plugin_name}, without naming it: {error!r}") from error
        return "refused"
    accuracy = train_stream_and_eval(strategy, benchmark)
    assert recorder.losses and all(math.isfinite(loss) for loss in recorder.losses), (
        f"{name} with {plugin_name}: non-finite training losses {recorder.losses}")
    assert_learns(name, accuracy)
    return "learns"


# ------------------------------------------------------------------ 1. Avalanche's stream generators


@pytest.mark.parametrize("stream", list(STREAMS))
def test_naive_runs_the_stream(stream, tmp_path):
    """The situation is valid Avalanche: Naive trains and evaluates it."""
    assert_learns("Naive", train_stream_and_eval(build_naive(), STREAMS[stream](tmp_path)))


@pytest.mark.parametrize("stream", list(STREAMS))
@pytest.mark.parametrize("name", STRATEGIES)
def test_learns_the_stream(name, stream, tmp_path):
    assert_learns(name, train_stream_and_eval(build(name), STREAMS[stream](tmp_path)))


@pytest.mark.parametrize("stream", list(TASK_LABELLED))
@pytest.mark.parametrize("name", ROUTED)
def test_oracle_routing_learns_a_stream_with_task_labels(name, stream, tmp_path):
    assert_learns(name, train_stream_and_eval(build(name, routing="oracle"), TASK_LABELLED[stream](tmp_path)))


@pytest.mark.parametrize("stream", list(UNLABELLED))
@pytest.mark.parametrize("name", ROUTED)
def test_oracle_routing_without_distinct_task_labels_is_refused_before_training(name, stream, tmp_path):
    benchmark = UNLABELLED[stream](tmp_path)
    recorder = LossRecorder()
    strategy = build(name, routing="oracle", plugins=[recorder])
    with pytest.raises(ValueError, match="oracle") as refusal:
        for experience in benchmark.train_stream:
            refused = experience.current_experience
            strategy.train(experience)
    assert re.search(r"task.?label", str(refusal.value), re.IGNORECASE), str(refusal.value)
    assert recorder.iterations.get(refused, 0) == 0, "refused only after training on the experience had begun"


# ------------------------------------------------------------------------- 2. periodic evaluation

PERIODIC = {
    "eval_every=0": dict(eval_every=0),
    "eval_every=1-epoch": dict(eval_every=1),
    "eval_every=1-iteration": dict(eval_every=1, peval_mode="iteration"),
}


@pytest.mark.parametrize("periodic", list(PERIODIC))
@pytest.mark.parametrize("name", WITH_NAIVE)
def test_periodic_evaluation_at_the_end_of_an_experience_is_the_evaluation_after_it(name, periodic, tmp_path):
    """Avalanche evaluates the eval streams before training (no expert yet: allowed, untrained
    metrics), periodically, and at the end of each experience: that last value must be what
    ``eval`` gives right after, the expert just trained included."""
    benchmark = nc(tmp_path)
    strategy = make(name, **PERIODIC[periodic])
    for experience in benchmark.train_stream:
        strategy.train(experience, eval_streams=[benchmark.test_stream])
        periodic_at_end = recorded_stream_accuracies(strategy, benchmark.test_stream)[-1]
        after = stream_accuracy(strategy.eval(benchmark.test_stream), benchmark.test_stream)
        assert periodic_at_end == pytest.approx(after, abs=1e-6), (
            f"experience {experience.current_experience}: periodic evaluation at its end {periodic_at_end}, "
            f"eval() right after {after}")
    # Initial evaluation (before any training) + at least one per experience + the eval() calls.
    assert len(recorded_stream_accuracies(strategy, benchmark.test_stream)) >= 1 + 2 + 2
    assert_learns(name, after)


# ------------------------------------------------------------ 3. early stopping and forward transfer


@pytest.mark.parametrize("name", WITH_NAIVE)
def test_early_stopping_with_periodic_evaluation_learns(name, tmp_path):
    benchmark = nc(tmp_path)
    stopper = EarlyStoppingPlugin(patience=2, val_stream_name=metric_stream_name(benchmark.test_stream))
    strategy = make(name, plugins=[stopper], eval_every=1)
    assert_learns(name, train_stream_and_eval(strategy, benchmark, eval_streams=[benchmark.test_stream]))


@pytest.mark.parametrize("name", WITH_NAIVE)
def test_forward_transfer_metrics_with_periodic_evaluation_are_finite(name, tmp_path):
    benchmark = nc(tmp_path)
    evaluator = quiet_evaluator(forward_transfer_metrics(experience=True, stream=True))
    strategy = make(name, evaluator=evaluator, eval_every=1)
    accuracy = train_stream_and_eval(strategy, benchmark, eval_streams=[benchmark.test_stream])
    transfer = {key: values for key, (_, values) in strategy.evaluator.get_all_metrics().items()
                if key.startswith("ExperienceForwardTransfer") or key.startswith("StreamForwardTransfer")}
    assert any(key.startswith("StreamForwardTransfer") for key in transfer), sorted(transfer)
    assert all(is_finite(v) for values in transfer.values() for v in values), transfer
    assert_learns(name, accuracy)


# --------------------------------------------------------------------------- 4. revisiting an experience


@pytest.mark.parametrize("name", WITH_NAIVE)
def test_revisiting_an_experience_keeps_finite_losses_and_learning(name, tmp_path):
    benchmark = nc(tmp_path)
    recorder = LossRecorder()
    strategy = make(name, plugins=[recorder])
    first, second = benchmark.train_stream
    for experience in (first, second, first):
        strategy.train(experience)
    assert recorder.losses and all(math.isfinite(loss) for loss in recorder.losses), recorder.losses
    assert_learns(name, stream_accuracy(strategy.eval(benchmark.test_stream), benchmark.test_stream))


# ------------------------------------------------------------------------------------- 5. plugins

PLUGINS = {
    "ReplayPlugin": lambda: ReplayPlugin(mem_size=40),
    "GDumbPlugin": lambda: GDumbPlugin(mem_size=40),
    "LwFPlugin": lambda: LwFPlugin(alpha=1.0, temperature=2.0),
    "EWCPlugin-separate": lambda: EWCPlugin(ewc_lambda=1.0, mode="separate"),
    "EWCPlugin-online": lambda: EWCPlugin(ewc_lambda=1.0, mode="online", decay_factor=0.5),
    "SynapticIntelligencePlugin": lambda: SynapticIntelligencePlugin(si_lambda=0.1),
}


@pytest.mark.parametrize("plugin", list(PLUGINS))
@pytest.mark.parametrize("name", WITH_NAIVE)
def test_replay_distillation_and_regularisation_plugins_learn_or_are_refused(name, plugin, tmp_path):
    outcome = learns_or_refuses(name, PLUGINS[plugin](), nc(tmp_path))
    if name == "Naive":
        assert outcome == "learns"


@pytest.mark.parametrize("name", WITH_NAIVE)
def test_lr_scheduler_plugin_drives_the_learning_rate_or_is_refused(name, tmp_path):
    """A user's StepLR (halving the lr every epoch) must set the lr of every training
    iteration (not the strategy's own cosine schedule), or be refused at construction."""
    gamma = 0.5
    recorder = LossRecorder()
    if name == "Naive":
        strategy = build_naive(plugins=[recorder])  # the scheduler goes on the optimizer given to Naive
        lr = strategy.optimizer.param_groups[0]["lr"]
        strategy.plugins.append(LRSchedulerPlugin(torch.optim.lr_scheduler.StepLR(strategy.optimizer, 1, gamma)))
    else:
        lr = SETTINGS[name]["lr"]
        # The strategies build their own optimizer: the scheduler can only be given one of the user's.
        placeholder = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        scheduler = LRSchedulerPlugin(torch.optim.lr_scheduler.StepLR(placeholder, step_size=1, gamma=gamma))
        try:
            strategy = build(name, plugins=[scheduler, recorder])
        except Exception as error:  # noqa: BLE001 - the message decides
            assert "LRSchedulerPlugin" in str(error), f"refused without naming LRSchedulerPlugin: {error!r}"
            return
    accuracy = train_stream_and_eval(strategy, nc(tmp_path))
    assert recorder.lrs, "no training iteration recorded"
    expected = {key: lr * gamma ** key[1] for key in recorder.lrs}
    actual = {key: sorted(set(values)) for key, values in recorder.lrs.items()}
    assert {key: [pytest.approx(value)] for key, value in expected.items()} == actual, (
        "the learning rate per (experience, epoch) does not follow the user's StepLR")
    assert_learns(name, accuracy)


def typical_evaluator(name: str, tmp_path, text: io.StringIO) -> EvaluationPlugin:
    own = [*routing_accuracy_metrics()] if name in ROUTED else []
    return EvaluationPlugin(
        accuracy_metrics(minibatch=True, epoch=True, experience=True, stream=True),
        loss_metrics(minibatch=True, epoch=True, experience=True, stream=True),
        forgetting_metrics(experience=True, stream=True),
        bwt_metrics(experience=True, stream=True),
        confusion_matrix_metrics(num_classes=NUM_CLASSES, stream=True),
        timing_metrics(epoch=True, experience=True),
        cpu_usage_metrics(experience=True),
        ram_usage_metrics(every=0.5, experience=True),
        disk_usage_metrics(paths_to_monitor=str(tmp_path), experience=True),
        *own,
        loggers=[TextLogger(text), CSVLogger(str(tmp_path / "csv"))],
    )


@pytest.mark.parametrize("name", WITH_NAIVE)
def test_evaluation_plugin_with_loggers_and_typical_metrics_learns(name, tmp_path):
    text = io.StringIO()
    benchmark = nc(tmp_path)
    strategy = make(name, evaluator=typical_evaluator(name, tmp_path, text))
    accuracy = train_stream_and_eval(strategy, benchmark)
    last = strategy.evaluator.get_last_metrics()
    for prefix in ("StreamForgetting", "StreamBWT", "Loss_Stream", "Top1_Acc_Stream"):
        values = [v for k, v in last.items() if k.startswith(prefix)]
        assert values and all(is_finite(v) for v in values), (prefix, sorted(last))
    logged = text.getvalue()
    assert "Top1_Acc_Stream" in logged and "StreamForgetting" in logged
    with open(tmp_path / "csv" / "eval_results.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert rows and all(math.isfinite(float(row["eval_accuracy"])) for row in rows)
    assert_learns(name, accuracy)


# ---------------------------------------------------------------- 6. backbones that are not timm ViTs


@pytest.mark.parametrize("strategy_class", [CoLoR, SPrompts, L2P], ids=STRATEGIES)
def test_a_torchvision_vit_is_refused_with_a_pointer_to_timm(strategy_class):
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(image_size=16, patch_size=4, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64)
    with pytest.raises(TypeError) as refusal:
        strategy_class(model, evaluator=quiet_evaluator())
    assert "torchvision" in str(refusal.value) and "timm" in str(refusal.value), str(refusal.value)
