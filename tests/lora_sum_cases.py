"""Checks shared by SD-LoRA and InfLoRA, two strategies on one adapted ViT and one head
(test_lora_sum.py runs them on each).

Each function takes the strategy class and runs on tiny seeded ViTs and streams in seconds.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
import torch
from avalanche.core import SupervisedPlugin

from avalanche_color import train_stream
from drop_in_cases import tiny_vit  # average pooling: a random tiny ViT's [CLS] output hardly depends on the image
from helpers import quiet_evaluator, stream_metric
from streams import class_stream

TEMPLATE_KEYWORDS = {"model", "config", "criterion", "device", "plugins", "evaluator"}
TINY = dict(rank=2, train_epochs=2, train_mb_size=16, eval_mb_size=64)


def fast(strategy_class) -> dict:
    """SGD at a high rate where the method offers it; LoRA subtraction has only its code's Adam."""
    return {"optimizer": "sgd", "lr": 0.05} if "optimizer" in strategy_class.config_class.names() else {"lr": 0.01}


def tiny(strategy_class, seed: int = 0, vit=None, **options):
    settings = {**TINY, **fast(strategy_class), **options}
    return strategy_class(model=tiny_vit(seed) if vit is None else vit, evaluator=quiet_evaluator(), **settings)


def check_signature_agrees_with_config(strategy_class, config_class) -> None:
    """Every keyword-only option of the strategy is a config field, with the same default and type."""
    signature = inspect.signature(strategy_class.__init__)
    options = {name: p for name, p in signature.parameters.items()
               if p.kind == p.KEYWORD_ONLY and name not in TEMPLATE_KEYWORDS}
    fields = {spec.name: spec for spec in dataclasses.fields(config_class)}
    assert sorted(options) == sorted(fields), "the strategy takes exactly the config's fields"
    strategy_hints = typing.get_type_hints(strategy_class.__init__)
    config_hints = typing.get_type_hints(config_class)
    for name, parameter in options.items():
        assert parameter.default == fields[name].default, name
        assert strategy_hints[name] == config_hints[name], name
    assert config_class.__name__ in inspect.getdoc(strategy_class.__init__), "the options' docs are the config's"


def check_bad_options_are_refused(strategy_class) -> None:
    for name, value, allowed in (("rank", 0, "integer >= 1"), ("optimizer", "adamw", "'sgd', 'adam'"),
                                 ("lr_schedule", "step", "'constant', 'cosine'"), ("lr", -1.0, "number > 0"),
                                 ("num_workers", -1, "integer >= 0")):
        with pytest.raises(ValueError, match=rf"{name} must .*{allowed}.*got {value!r}"):
            strategy_class(model=tiny_vit(), **{name: value})
    # Avalanche's optimizer= takes an optimiser object; here it names the one built per experience,
    # and an object is refused as every strategy of the package refuses it.
    with pytest.raises(TypeError, match=r"takes no optimiser object as optimizer=, got SGD; set optimizer, lr"):
        strategy_class(model=tiny_vit(), optimizer=torch.optim.SGD(tiny_vit().parameters(), lr=0.1))
    with pytest.raises(TypeError, match="VisionTransformer"):
        strategy_class(model=torch.nn.Linear(3, 3))
    from avalanche.training.plugins import LRSchedulerPlugin, ReplayPlugin

    with pytest.raises(ValueError, match="cannot use ReplayPlugin: the method is rehearsal-free"):
        strategy_class(model=tiny_vit(), plugins=[ReplayPlugin(mem_size=10)])
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(tiny_vit().parameters(), lr=0.1), 1)
    with pytest.raises(ValueError, match="cannot use LRSchedulerPlugin"):
        strategy_class(model=tiny_vit(), plugins=[LRSchedulerPlugin(scheduler)])


class TrainableCounts(SupervisedPlugin):
    """The number of parameters the optimiser of each experience trains."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[int] = []

    def before_training_exp(self, strategy, **kwargs):
        self.counts.append(sum(p.numel() for group in strategy.optimizer.param_groups for p in group["params"]))


def trained_counts(strategy_class, experiences: int = 3, **options) -> list[int]:
    counts = TrainableCounts()
    strategy = tiny(strategy_class, plugins=[counts], train_epochs=1, **options)
    for experience in class_stream(num_experiences=experiences, per_class=4).train_stream:
        strategy.train(experience)
    return counts.counts


class CrashAfterEpoch(SupervisedPlugin):
    """Raises after the given epoch of the given experience (a crash mid-run)."""

    def __init__(self, experience: int, epoch: int) -> None:
        super().__init__()
        self.experience, self.epoch = experience, epoch

    def after_training_epoch(self, strategy, **kwargs):
        if strategy.experience.current_experience == self.experience and \
                strategy.clock.train_exp_epochs == self.epoch:
            raise RuntimeError("crash")


def check_resume_equals_uninterrupted(strategy_class, tmp_path: Path, **options) -> None:
    """A run stopped mid-experience and resumed from its checkpoint ends as the run that never stopped."""
    settings = dict(train_epochs=3, **options)
    benchmark = class_stream(num_experiences=3, per_class=8)
    torch.manual_seed(1)
    whole = tiny(strategy_class, **settings)
    records = train_stream(whole, benchmark, checkpoint=tmp_path / "whole.ckpt")

    torch.manual_seed(1)
    crashed = tiny(strategy_class, plugins=[CrashAfterEpoch(experience=1, epoch=2)], **settings)
    with pytest.raises(RuntimeError, match="crash"):
        train_stream(crashed, benchmark, checkpoint=tmp_path / "run.ckpt", every_n_epochs=1)
    resumed = tiny(strategy_class, **settings)
    assert train_stream(resumed, benchmark, checkpoint=tmp_path / "run.ckpt") == records
    same_state(resumed.model.experts_state_dict(), whole.model.experts_state_dict())
    assert stream_metric_of(records[-1]) > 0.3  # it learned; the exact state comparison above is the check


def stream_metric_of(record: dict) -> float:
    return stream_metric(record, "Top1_Acc")


def same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def check_pretrained_round_trip(strategy_class, model_class, tmp_path: Path) -> None:
    """save_pretrained then from_pretrained on the same backbone predicts bit-identically; another is refused."""
    strategy = tiny(strategy_class)
    benchmark = class_stream(num_experiences=2, per_class=8)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    images = torch.stack([sample[0] for e in benchmark.test_stream for sample in e.dataset])
    model = strategy.model.eval()
    model.save_pretrained(tmp_path / "saved")
    loaded = model_class.from_pretrained(tmp_path / "saved", tiny_vit(0))
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images))
    with pytest.raises(ValueError, match="another one"):
        model_class.from_pretrained(tmp_path / "saved", tiny_vit(1))
    # The weights file is verified against the size and SHA-256 config.json records, as CoLoR's.
    from avalanche_color import SavedModelError

    weights = tmp_path / "saved" / "weights.safetensors"
    data = weights.read_bytes()
    changed = bytearray(data)
    changed[len(data) // 2: len(data) // 2 + 8] = bytes(8)
    weights.write_bytes(bytes(changed))
    with pytest.raises(SavedModelError, match="weights.safetensors is not the file saved with this config.json"):
        model_class.from_pretrained(tmp_path / "saved", tiny_vit(0))
    weights.write_bytes(data[:-10])
    with pytest.raises(SavedModelError, match=f"weights.safetensors is {len(data) - 10} bytes, config.json records "
                                              f"{len(data)}"):
        model_class.from_pretrained(tmp_path / "saved", tiny_vit(0))
    (tmp_path / "saved" / "config.json").write_text("{")
    with pytest.raises(SavedModelError, match="config.json is not valid JSON"):
        model_class.from_pretrained(tmp_path / "saved", tiny_vit(0))


def check_dtype(strategy_class, dtype: torch.dtype, tmp_path: Path, trained: torch.dtype | None = None) -> None:
    """A backbone in ``dtype`` trains and evaluates (images of another precision are converted), and learns as
    the float32 run does. The learned weights (:meth:`experts_state_dict`) and the logits are in ``trained``
    (None: ``dtype``, the weights following the backbone); the frozen backbone stays in ``dtype``."""
    import drop_in_cases as cases

    trained = dtype if trained is None else trained
    accuracies = {}
    for precision in (torch.float32, dtype):
        strategy = tiny(strategy_class, vit=tiny_vit(0).to(precision), train_epochs=3)
        accuracies[precision] = cases.train_stream_and_eval(strategy, cases.nc(tmp_path))
    model = strategy.model.eval()
    images = torch.stack([sample[0] for sample in cases.nc(tmp_path).test_stream[0].dataset])
    with torch.no_grad():
        logits = model(images)
    assert logits.dtype == trained and bool(logits.isfinite().all())
    learned = model.experts_state_dict()
    assert {p.dtype for name, p in model.named_parameters() if name in learned} == {trained}
    assert {p.dtype for name, p in model.named_parameters() if name not in learned} == {dtype}
    assert accuracies[torch.float32] > cases.LEARNED
    assert abs(accuracies[dtype] - accuracies[torch.float32]) <= 0.1, accuracies


def drop_in_accuracy(strategy_class, stream: str, tmp_path: Path, **options) -> float:
    """Final stream accuracy on one of test_drop_in's Avalanche streams (built as a user's script would)."""
    import drop_in_cases as cases

    settings = {**TINY, **fast(strategy_class), "train_epochs": 3, **options}
    strategy = strategy_class(model=cases.tiny_vit(), evaluator=cases.quiet_evaluator(), **settings)
    return cases.train_stream_and_eval(strategy, cases.STREAMS[stream](tmp_path))


def check_online_stream_with_task_boundaries(strategy_class, tmp_path: Path) -> None:
    """Chunks of Avalanche's online scenario continue their experience's component: one per experience."""
    import drop_in_cases as cases

    chunks, test_stream = cases.online(tmp_path, access_task_boundaries=True)
    strategy = strategy_class(model=tiny_vit(), evaluator=cases.quiet_evaluator(),
                              **{**TINY, **fast(strategy_class), "train_epochs": 3})
    for chunk in chunks:
        strategy.train(chunk)
    assert strategy.model.num_experts == 2 and strategy.model.finished.tolist() == [True, True]
    assert cases.stream_accuracy(strategy.eval(test_stream), test_stream) > cases.LEARNED


def check_model_and_config_first_without_warnings(strategy_class, model_class) -> None:
    """``Strategy(vit, rank=...)`` and ``Strategy(vit, config)`` work silently, as ``CoLoR(vit, rank=...)``
    (Avalanche's warning on positional arguments does not apply: see ``StrategyBase.__init_subclass__``)."""
    import warnings

    from avalanche.training.templates.base import PositionalArgumentsDeprecatedWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", PositionalArgumentsDeprecatedWarning)
        strategy = strategy_class(tiny_vit(), rank=2)
        assert strategy_class(tiny_vit(), strategy_class.config_class(rank=3)).config.rank == 3
    assert isinstance(strategy.model, model_class) and strategy.config.rank == 2


def check_loader_options_reach_every_loader(strategy_class, monkeypatch) -> None:
    """num_workers reaches every DataLoader that loads data (training, evaluation, the data scan, InfLoRA's
    input passes; Avalanche also builds loaders without workers only to size its samplers, never iterated)."""
    import torch.utils.data

    seen: list[int] = []
    original = torch.utils.data.DataLoader.__iter__

    def recording(self):
        seen.append(self.num_workers)
        return original(self)

    monkeypatch.setattr(torch.utils.data.DataLoader, "__iter__", recording)
    strategy = tiny(strategy_class, num_workers=1, train_epochs=1)
    benchmark = class_stream(num_experiences=1, per_class=4)
    strategy.train(benchmark.train_stream[0])
    strategy.eval(benchmark.test_stream)
    assert len(seen) >= 3 and set(seen) == {1}, seen


def check_the_runner_reports_what_the_first_experience_trains(strategy_class) -> None:
    from avalanche_color.runner.run import trainable_parameters_per_experience

    counts = TrainableCounts()
    strategy = tiny(strategy_class, plugins=[counts], train_epochs=1)
    stream = class_stream(num_experiences=3, per_class=4).train_stream
    for experience in stream:
        strategy.train(experience)
    assert trainable_parameters_per_experience(strategy, stream[0]) == counts.counts[0]
