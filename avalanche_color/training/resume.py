"""Checkpoint and resume a CoLoR run: a plugin that saves, and a loop that picks up where a run stopped.

Typical use (the whole API)::

    strategy = CoLoR(vit, rank=8, k=5, train_epochs=50)
    records = train_stream(strategy, benchmark, checkpoint="runs/color.ckpt", every_n_epochs=5)

Run the same script again after a crash and it continues from the last good
checkpoint: the experiences already learned are loaded, not trained again; a
mid-experience checkpoint restores the optimiser, the cosine schedule and the
random generators, so the finished run equals one that never stopped (on CPU:
bit for bit). ``resume=False`` starts over and overwrites the file.

A checkpoint written under other options is refused, naming each option that differs: the
model's settings (backbone, rank, alpha, routing, classes) always, and every other option that
changes what the run learns (``k``, ``lr``, ``train_epochs``, ...: all but
:data:`OPTIONS_FREE_ON_RESUME`) unless named in ``allow_changed``, which continues the run with
the new values from where it stopped (the experiences already learned keep the old ones).

For a loop of your own, put a :class:`ResumePlugin` in the strategy's
plugins and call :meth:`ResumePlugin.resume` before training.
(The plugin is in :mod:`avalanche_color.training.resume_plugin`, the options check in
:mod:`avalanche_color.training.resume_options`.)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from avalanche_color.training.checkpoint import CheckpointError, read_header
from avalanche_color.training.resume_plugin import ResumePlugin, Record
from avalanche_color.utils.experiences import experience_classes
from avalanche_color.utils.files import PathLike

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate

Evaluate = Callable[["SupervisedTemplate", int], Record]


def train_stream(
    strategy: "SupervisedTemplate",
    benchmark: Any,
    *,
    checkpoint: Union[PathLike, ResumePlugin, None] = None,
    every_n_epochs: Optional[int] = None,
    resume: bool = True,
    evaluate: Optional[Evaluate] = None,
    loader_options: Optional[Mapping[str, Any]] = None,
    allow_changed: Collection[str] = (),
) -> list[Record]:
    """Train on every experience of ``benchmark.train_stream`` in order, evaluating after each.

    With ``checkpoint``, the run is saved after each experience (and every
    ``every_n_epochs`` epochs) and, if the file exists and ``resume`` is true,
    continued from it: learned experiences are loaded, not retrained, and
    their evaluation records come back from the file.

    Args:
        strategy: a CoLoR strategy (any Avalanche strategy without ``checkpoint``).
        benchmark: has ``train_stream`` and ``test_stream``.
        checkpoint: the checkpoint file, or a :class:`ResumePlugin` (not already
            among the strategy's plugins).
        every_n_epochs: with a path, also save every this many epochs.
        resume: continue from an existing checkpoint file; False starts over. A checkpoint
            written under other options is refused (a :class:`CheckpointError` naming each).
        allow_changed: options of the strategy that may differ from the checkpoint's on resume
            (e.g. ``["train_epochs"]`` to train the remaining experiences longer): the run
            continues with the new values; the experiences already learned keep the old ones.
            The model's own settings (rank, alpha, routing, ...) can never change.
        evaluate: ``evaluate(strategy, index)`` after training experience ``index``
            gives that experience's record (JSON-able); by default the numeric
            metrics of ``strategy.eval(benchmark.test_stream[: index + 1], **loader_options)``.
        loader_options: keywords of every ``strategy.train`` call and of the default evaluation
            (Avalanche's ``num_workers``, ``pin_memory``, ``persistent_workers``), so that any
            Avalanche strategy loads its data as the package's strategies do with their options.

    Returns:
        one record per training experience, those restored from the checkpoint included.
    """
    loader_options = dict(loader_options or {})
    evaluate = evaluate or _evaluate_seen(benchmark, loader_options)
    stream = benchmark.train_stream
    plugin = _resume_plugin(checkpoint, every_n_epochs)
    if plugin is None:
        return [_train_and_evaluate(strategy, experience, index, evaluate, loader_options)
                for index, experience in enumerate(stream)]
    if any(p is plugin for p in strategy.plugins):
        raise ValueError("checkpoint must not already be one of the strategy's plugins: train_stream adds it")
    stream_classes = [experience_classes(e) for e in stream]  # also where a stream records no classes
    plugin.stream_classes = stream_classes
    if resume and plugin.path.exists():
        position = read_header(plugin.path)["experiences_done"]
        if position > len(stream):  # refused before anything is loaded
            raise CheckpointError(f"checkpoint {plugin.path} is {position} experiences into its stream; "
                                  f"this stream has {len(stream)}")
        plugin.resume(strategy, stream_classes, allow_changed)
    strategy.plugins.append(plugin)  # removed again below: the strategy is left as it came
    try:
        for index, experience in enumerate(stream):
            if index >= plugin.experiences_done:
                strategy.train(experience, **loader_options)
            if index >= len(plugin.records):  # also an experience saved before its evaluation
                plugin.records.append(evaluate(strategy, index))
                plugin.experiences_done = index + 1
                plugin.save(strategy)
    finally:
        strategy.plugins.remove(plugin)
    return list(plugin.records)


def _train_and_evaluate(strategy: "SupervisedTemplate", experience: Any, index: int, evaluate: Evaluate,
                        loader_options: Mapping[str, Any]) -> Record:
    strategy.train(experience, **loader_options)
    return evaluate(strategy, index)


def _evaluate_seen(benchmark: Any, loader_options: Mapping[str, Any]) -> Evaluate:
    def evaluate(strategy: "SupervisedTemplate", index: int) -> Record:
        metrics = strategy.eval(benchmark.test_stream[: index + 1], **loader_options)
        return {name: value for name, value in metrics.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool)}
    return evaluate


def _resume_plugin(checkpoint: Union[PathLike, ResumePlugin, None],
                       every_n_epochs: Optional[int]) -> Optional[ResumePlugin]:
    if checkpoint is None:
        if every_n_epochs is not None:
            raise ValueError(f"every_n_epochs={every_n_epochs!r} needs a checkpoint path")
        return None
    if isinstance(checkpoint, ResumePlugin):
        if every_n_epochs is not None:
            raise ValueError("give every_n_epochs to the ResumePlugin, not to train_stream")
        return checkpoint
    return ResumePlugin(checkpoint, every_n_epochs)
