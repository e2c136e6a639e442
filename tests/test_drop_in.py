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

from avalanche_color import L2P, CoLoR, ExpertViT, SPrompts, routing_accuracy_metrics
from drop_in_cases import (
    CHANCE,
    CLASSES,
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
    mixed_task_labels,
    nc,
    online,
    quiet_evaluator,
    stream_accuracy,
    tiny_vit,
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
    assert_learns(name, train_stream_and_eval(build(name, router="oracle"), TASK_LABELLED[stream](tmp_path)))


@pytest.mark.parametrize("stream", list(UNLABELLED))
@pytest.mark.parametrize("name", ROUTED)
def test_oracle_routing_without_distinct_task_labels_is_refused_before_training(name, stream, tmp_path):
    benchmark = UNLABELLED[stream](tmp_path)
    recorder = LossRecorder()
    strategy = build(name, router="oracle", plugins=[recorder])
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


# ---------------------------------------------------------------------- 7. online streams (issue 24)

ONLINE = {"split_online_stream": dict(scenario=False), "OnlineCLScenario": dict(scenario=True)}


@pytest.mark.parametrize("online_stream", list(ONLINE))
@pytest.mark.parametrize("name", WITH_NAIVE)
def test_online_stream_with_task_boundaries_learns_as_the_whole_stream(name, online_stream, tmp_path):
    """Chunks of 10 samples with access_task_boundaries=True: one expert per origin experience,
    trained across its chunks, with prototypes from all of them; accuracy as with whole experiences."""
    chunks, test_stream = online(tmp_path, access_task_boundaries=True, **ONLINE[online_stream])
    strategy = make(name)
    for chunk in chunks:
        strategy.train(chunk)
    accuracy = stream_accuracy(strategy.eval(test_stream), test_stream)
    assert_learns(name, accuracy)
    if name in ROUTED:
        model = strategy.model
        assert model.bank.experiences.tolist() == [0, 1], "one expert per origin experience"
        assert model.bank.finished.tolist() == [True, True]
        assert sorted(set(model.router.owners.tolist())) == [0, 1], "prototypes for both experts"
        assert model.router.owners.tolist().count(1) == SETTINGS[name]["k"]
    if name != "Naive":  # Naive forgets either way: it only shows the situation is valid Avalanche
        whole = train_stream_and_eval(make(name), nc(tmp_path))
        assert accuracy >= whole - 0.1, f"{name}: online {accuracy:.3f}, whole experiences {whole:.3f}"


@pytest.mark.parametrize("name", ROUTED)
def test_online_k_larger_than_a_chunk_fits_from_all_chunks_and_evaluates_between_them(name, tmp_path):
    """k=12 with chunks of 10: refused for no chunk; an evaluation after each chunk fits the
    prototypes from the chunks so far (at most one per sample seen); the last fit uses all 40."""
    chunks, test_stream = online(tmp_path, access_task_boundaries=True)
    strategy = make(name, k=12)
    accuracies = []
    for chunk in chunks:
        strategy.train(chunk)
        accuracies.append(stream_accuracy(strategy.eval(test_stream), test_stream))
        expert = chunk.origin_experience.current_experience
        seen = (chunk.current_experience % 4 + 1) * 10
        assert strategy.model.router.owners.tolist().count(expert) == min(12, seen)
    assert strategy.model.num_experts == 2
    assert_learns(name, accuracies[-1])
    assert accuracies[3] == pytest.approx(0.5), "after experience 0: its two classes of four, all right"


@pytest.mark.parametrize("online_stream", list(ONLINE))
@pytest.mark.parametrize("name", STRATEGIES)
def test_online_stream_without_task_boundaries_is_refused_or_learns(name, online_stream, tmp_path):
    """Without task boundaries a chunk cannot say which experience it belongs to: the routed
    strategies (one expert per experience) refuse it before training, naming the setting that
    fixes it; L2P (one shared prompt pool, no experts) learns the chunks as they come."""
    chunks, test_stream = online(tmp_path, access_task_boundaries=False, **ONLINE[online_stream])
    recorder = LossRecorder()
    strategy = make(name, plugins=[recorder])
    if name in ROUTED:
        with pytest.raises(ValueError, match=r"access_task_boundaries=True"):
            strategy.train(next(iter(chunks)))
        assert not recorder.losses and strategy.model.num_experts == 0, "refused after training began"
        return
    for chunk in chunks:
        strategy.train(chunk)
    assert_learns(name, stream_accuracy(strategy.eval(test_stream), test_stream))


@pytest.mark.parametrize("name", ROUTED)
def test_k_larger_than_an_ordinary_experience_is_refused_before_training(name, tmp_path):
    recorder = LossRecorder()
    strategy = make(name, k=41, plugins=[recorder])  # each experience of nc has 40 samples
    with pytest.raises(ValueError, match=r"k must be at most the experience's sample count: k=41, .* 40 samples"):
        strategy.train(nc(tmp_path).train_stream[0])
    assert not recorder.losses and strategy.model.num_experts == 0


# ------------------------------------------------------ 8. several task labels in one experience (issue 24)


@pytest.mark.parametrize("name", WITH_NAIVE)
def test_experiences_with_several_task_labels_learn(name, tmp_path):
    """Each experience mixes task labels 1-4 (as Avalanche's tensor-dataset and task_metrics
    examples): no routing here reads task labels, so all learn."""
    assert_learns(name, train_stream_and_eval(make(name), mixed_task_labels(tmp_path)))


@pytest.mark.parametrize("name", ROUTED)
def test_oracle_routing_refuses_an_experience_with_several_task_labels(name, tmp_path):
    recorder = LossRecorder()
    strategy = make(name, router="oracle", plugins=[recorder])
    with pytest.raises(ValueError, match=r"router='oracle' .* must have one task label, got \[1, 2, 3, 4\]"):
        strategy.train(mixed_task_labels(tmp_path).train_stream[0])
    assert not recorder.losses and strategy.model.num_experts == 0


# ---------------------------------------------------------- 9. one model object, several strategies (issue 24)


@pytest.mark.parametrize("name", STRATEGIES)
def test_one_vit_serves_several_strategies_and_stays_as_it_was(name, tmp_path):
    """Avalanche's scripts give one model object to several strategies: each strategy adapts
    its own copy, so every one learns and the ViT given stays unchanged and trainable."""
    vit = tiny_vit()
    before = {key: value.clone() for key, value in vit.state_dict().items()}
    for _ in range(2):
        assert_learns(name, train_stream_and_eval(make(name, model=vit), nc(tmp_path)))
    assert vit.state_dict().keys() == before.keys()
    assert all(torch.equal(value, before[key]) for key, value in vit.state_dict().items())
    assert all(parameter.requires_grad for parameter in vit.parameters())


MODEL_OPTION = {"CoLoR": dict(rank=2), "SPrompts": dict(prompt_length=3), "L2P": dict(top_n=1)}


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_strategys_model_continues_with_training_options_and_refuses_model_options(name, tmp_path):
    first = make(name)
    first.train(nc(tmp_path).train_stream[0])
    # Training options (Avalanche's periodic evaluation, epochs, lr) may be given with the model.
    second = CLASSES[name](first.model, evaluator=quiet_evaluator(), eval_every=1, train_epochs=3, lr=0.05,
                           train_mb_size=16, eval_mb_size=64)
    second.train(nc(tmp_path).train_stream[1])
    assert_learns(name, stream_accuracy(second.eval(nc(tmp_path).test_stream), nc(tmp_path).test_stream))
    [(option, value)] = MODEL_OPTION[name].items()
    with pytest.raises(ValueError, match=rf"leave \['{option}'\] unset"):
        CLASSES[name](first.model, evaluator=quiet_evaluator(), **{option: value})


def test_a_vit_already_carrying_lora_experts_is_refused_with_what_to_pass():
    vit = tiny_vit()
    ExpertViT(vit, rank=2)  # adapts vit in place
    with pytest.raises(ValueError, match=r"pass a plain timm ViT .* or that ExpertViT \(strategy.model\)"):
        CoLoR(vit, evaluator=quiet_evaluator())


# ------------------------------------------------- 10. Avalanche's save_checkpoint / maybe_load_checkpoint (issue 24)


@pytest.fixture
def dill_by_reference():
    """The documented setting (README, Works with Avalanche): dill pickles classes by reference."""
    import dill

    saved = dill.settings["byref"]
    dill.settings["byref"] = True
    yield
    dill.settings["byref"] = saved


@pytest.mark.parametrize("name", WITH_NAIVE)
def test_avalanche_checkpointing_resumes_to_the_same_metrics(name, tmp_path, dill_by_reference):
    """Avalanche's examples/checkpointing.py: save_checkpoint after each experience, a fresh
    process (here: a fresh strategy) resumes with maybe_load_checkpoint; the metrics equal
    those of an uninterrupted run."""
    from avalanche.checkpointing import maybe_load_checkpoint, save_checkpoint
    from avalanche.training.determinism.rng_manager import RNGManager

    benchmark = nc(tmp_path)
    RNGManager.set_random_seeds(1234)
    uninterrupted = train_stream_and_eval(make(name), benchmark)

    path = tmp_path / "checkpoint.pkl"
    RNGManager.set_random_seeds(1234)
    strategy, start = maybe_load_checkpoint(make(name), path)
    assert start == 0
    strategy.train(benchmark.train_stream[0])
    save_checkpoint(strategy, path)
    del strategy  # "the process dies"; a new one builds the strategy and resumes
    RNGManager.set_random_seeds(999)  # the checkpoint restores the generators
    resumed, start = maybe_load_checkpoint(make(name), path)
    assert start == 1
    for experience in benchmark.train_stream[start:]:
        resumed.train(experience)
    accuracy = stream_accuracy(resumed.eval(benchmark.test_stream), benchmark.test_stream)
    assert accuracy == pytest.approx(uninterrupted, abs=1e-9)
    assert_learns(name, accuracy)


@pytest.mark.parametrize("router", ["ridge", "gaussian"])
def test_online_class_router_learns_from_every_chunk_and_counts_each_sample_once(router, tmp_path):
    """A class-level router on an online stream: refitted from the chunks so far at every evaluation
    between chunks (its pending samples replaced, not added), then kept for good at the end."""
    chunks, test_stream = online(tmp_path, access_task_boundaries=True)
    strategy = make("CoLoR", router=router, router_width=128)
    for chunk in chunks:
        strategy.train(chunk)
        strategy.eval(test_stream)
    accuracy = stream_accuracy(strategy.eval(test_stream), test_stream)
    assert_learns("CoLoR", accuracy)
    class_router = strategy.model.router
    assert sorted(set(class_router.pair_experts.tolist())) == [0, 1] and int(class_router.pending_expert) == -1
    if router == "gaussian":  # its statistics count samples: each training sample exactly once
        assert int(class_router.classifier.counts.sum()) == sum(len(chunk.dataset) for chunk in chunks)
