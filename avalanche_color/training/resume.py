"""Checkpoint and resume a run: the checkpoint file, the options a resume may not change, the plugin that
saves and loads a run (:class:`ResumePlugin`), and the loop that picks up where a run stopped (:func:`train_stream`).

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
plugins and call :meth:`ResumePlugin.resume` before training. It is named apart from Avalanche's own
``CheckpointPlugin`` (deprecated since Avalanche 0.5 for ``save_checkpoint`` / ``maybe_load_checkpoint``),
whose files it neither writes nor reads (docs/guide/checkpoints.md).

**The checkpoint file** is the project's own format, not Avalanche's ``save_checkpoint``. That one
dill-pickles the whole strategy (frozen backbone, data loaders, loggers and
plugins included), so a file is as large as the backbone, breaks when any of
those objects stops pickling (with torch >= 2.13 the optimiser class does:
"Can't pickle sentinel") and needs an unsafe unpickler to read. A CoLoR run's
learned state is small and all tensors, so it is saved as such:

* line 1: a JSON header: format name, format version, the payload's size and
  SHA-256, and the stream position (readable with ``head -1``);
* then the payload: ``torch.save`` of a dict of tensors and plain values, read
  with ``torch.load(weights_only=True)`` (no code runs when loading).

The payload holds the experts, heads, prototypes and class maps
(:meth:`ExpertViT.experts_state_dict`, no backbone weights), the model's
settings (rank, alpha, routing features, router, distance, feature normalisation), a fingerprint
of the frozen backbone, the stream position (experiences finished, epochs
finished in the current one), the evaluation records so far, the optimiser and
scheduler state when saved mid-experience, and the Python, NumPy and torch
(CPU and CUDA) RNG states. Files are written atomically: a temporary file in
the same folder, flushed and fsynced, then renamed over the old one, so a
crash mid-save leaves the previous checkpoint intact.

Loading checks everything before it changes anything: a file that is
truncated, corrupt, of another format version, or written for another
backbone, rank, alpha, routing features, router or class set is refused with a
:class:`CheckpointError` naming what differs, and the model stays as it was; so is one written
under other training options (``k``, ``lr``, ``train_epochs``, ...), unless the caller allows them
(``train_stream(..., allow_changed=[...])``).
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Collection, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
from avalanche.core import SupervisedPlugin
from torch import Tensor, nn

from avalanche_color.experts.saved import backbone_fingerprint, model_extras, model_settings, restore_model_extras
from avalanche_color.utils.checks import positive_int, require
from avalanche_color.utils.experiences import experience_classes
from avalanche_color.utils.files import PathLike, write_atomically
from avalanche_color.utils.rng import capture_rng, restore_rng

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate

# ---------------------------------------------------------------------- the checkpoint file

FORMAT = "avalanche_color.checkpoint"
VERSION = 2  # 2: experts carry expert_finished (revisited experiences get a further expert)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or does not fit the run it is loaded into."""


@dataclass
class Checkpoint:
    """The content of a checkpoint file (nothing applied to a model yet).

    Attributes:
        experiences_done: training experiences finished (the next one to train).
        epochs_done: epochs finished of experience ``experiences_done``; 0 at an
            experience boundary, else the optimiser and scheduler states are set.
        train_epochs: the strategy's epochs per experience when it was saved.
        records: one evaluation record (metric name -> value) per evaluated experience.
        settings: the model's class, rank, alpha, routing features, router, distance and normalisation.
        backbone: fingerprint of the frozen backbone (see :func:`~avalanche_color.experts.saved.backbone_fingerprint`).
        stream_classes: the classes of every training experience of the stream, if known.
        experts: the model's :meth:`~ExpertViT.experts_state_dict`.
        model_extras: Avalanche's bookkeeping on the model (``max_class_label``, ...).
        optimizer, lr_scheduler: their ``state_dict`` mid-experience, else None.
        rng: the random generators' states at saving time.
        options: the strategy's options (every field of its config, as JSON values) when it was
            saved; None for strategies without a config and for checkpoints written before they
            were recorded. A resume under other options that change the run is refused
            (:func:`changed_options`).
        cpu_seconds, wall_seconds: the CPU and wall time the run had spent when it was saved, over every attempt
            (0 in checkpoints written before they were recorded), so a run resumed across sessions reports its
            whole cost.
    """

    experiences_done: int
    epochs_done: int
    train_epochs: int
    records: list[dict[str, Any]]
    settings: dict[str, Any]
    backbone: str
    stream_classes: Optional[list[list[int]]]
    experts: dict[str, Tensor]
    model_extras: dict[str, Any] = field(default_factory=dict)
    optimizer: Optional[dict[str, Any]] = None
    lr_scheduler: Optional[dict[str, Any]] = None
    rng: dict[str, Any] = field(default_factory=dict)
    options: Optional[dict[str, Any]] = None
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0


# ---------------------------------------------------------------------- writing and reading it


def write_checkpoint(path: PathLike, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (the old file stays until the new one is complete)."""
    buffer = io.BytesIO()
    torch.save(_payload(checkpoint), buffer)
    payload = buffer.getvalue()
    header = {
        "format": FORMAT,
        "version": VERSION,
        "payload_bytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "experiences_done": checkpoint.experiences_done,
        "epochs_done": checkpoint.epochs_done,
    }
    write_atomically(path, json.dumps(header).encode() + b"\n" + payload)


def read_header(path: PathLike) -> dict[str, Any]:
    """The JSON header of a checkpoint file (format, version, position), without the payload."""
    with open(path, "rb") as file:
        return _parse_header(Path(path), file.readline())


def read_checkpoint(path: PathLike) -> Checkpoint:
    """Read and verify a checkpoint file; nothing is applied to any model.

    Raises:
        CheckpointError: the file is truncated, corrupt, of another format or version.
    """
    path = Path(path)
    raw = path.read_bytes()
    first_line, _, payload = raw.partition(b"\n")
    header = _parse_header(path, first_line)
    expected = header["payload_bytes"]
    if len(payload) != expected:
        raise CheckpointError(
            f"checkpoint {path} is truncated or damaged: its payload has {len(payload)} bytes, "
            f"the header says {expected}; resume from an intact checkpoint or start over"
        )
    if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise CheckpointError(f"checkpoint {path} is corrupt: its payload does not match the header's SHA-256")
    try:
        content = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        return Checkpoint(**content)
    except Exception as error:  # a payload that passed the checksum but is not ours
        raise CheckpointError(f"checkpoint {path} has an unreadable payload: {error}") from error


def check_fits(checkpoint: Checkpoint, model: nn.Module, path: PathLike,
               stream_classes: Optional[list[list[int]]] = None,
               fingerprint: Optional[str] = None) -> None:
    """Refuse a checkpoint whose experts do not fit ``model`` (or whose classes not the stream).

    Every difference is named; nothing is changed.
    """
    problems = []
    current = model_settings(model)
    saved = checkpoint.settings
    for name in sorted(set(current) | set(saved)):
        if saved.get(name) != current.get(name):
            problems.append(f"{name}: checkpoint {saved.get(name)!r}, model {current.get(name)!r}")
    fingerprint = fingerprint or backbone_fingerprint(model)
    if checkpoint.backbone != fingerprint:
        problems.append(
            f"backbone: the checkpoint's experts were trained on another backbone "
            f"(fingerprint {checkpoint.backbone[:12]}, this model's {fingerprint[:12]})"
        )
    if stream_classes is not None and checkpoint.stream_classes is not None \
            and checkpoint.stream_classes != stream_classes:
        problems.append(
            f"classes: the checkpoint's stream has classes {checkpoint.stream_classes} per experience, "
            f"this stream {stream_classes}"
        )
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit this run: " + "; ".join(problems))


def _payload(checkpoint: Checkpoint) -> dict[str, Any]:
    payload = dict(vars(checkpoint))
    payload["experts"] = {k: v.detach().to("cpu") for k, v in checkpoint.experts.items()}
    # Records travel as JSON text: any metric value that is not plain data fails here, at saving.
    payload["records"] = json.loads(json.dumps(checkpoint.records))
    payload["options"] = None if checkpoint.options is None else json.loads(json.dumps(checkpoint.options))
    return payload


def _parse_header(path: Path, line: bytes) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is not an avalanche_color checkpoint (or its header is truncated): "
            f"its first line should be a JSON header with format {FORMAT!r}"
        )
    if header.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {header.get('version')!r}; this avalanche_color "
            f"reads version {VERSION}"
        )
    return header


# ---------------------------------------------------------------------- the options a resume may not change

# Options that may differ on resume: they decide how data is loaded and evaluated, not what is learned.
OPTIONS_FREE_ON_RESUME = frozenset({"num_workers", "pin_memory", "persistent_workers", "eval_mb_size",
                                    "eval_every", "cache_evaluation", "check_data", "prototype_batch_size"})


def recorded_options(strategy: "SupervisedTemplate") -> Optional[dict[str, Any]]:
    """Every option of ``strategy``'s config as JSON values (None for a strategy without one)."""
    config = getattr(strategy, "config", None)
    as_dict = getattr(config, "as_dict", None)
    return None if as_dict is None else json.loads(json.dumps(as_dict()))


def changed_options(saved: Optional[Mapping[str, Any]], current: Optional[Mapping[str, Any]],
                    allow_changed: Collection[str] = ()) -> list[str]:
    """Each option that differs between a checkpoint's ``saved`` options and the strategy's ``current``
    ones, as ``"name: checkpoint .., strategy .."``, leaving out :data:`OPTIONS_FREE_ON_RESUME` and
    ``allow_changed`` (nothing when either side recorded no options)."""
    if saved is None or current is None:
        return []
    free = OPTIONS_FREE_ON_RESUME | set(allow_changed)
    return [f"{name}: checkpoint {saved.get(name)!r}, strategy {current.get(name)!r}"
            for name in sorted(set(saved) | set(current))
            if name not in free and saved.get(name) != current.get(name)]


def with_later_defaults(saved: Optional[Mapping[str, Any]], strategy: "SupervisedTemplate") -> Optional[dict[str, Any]]:
    """A checkpoint's ``saved`` options, with each option of ``strategy``'s config that it does not record at that
    option's default: an option added to the package after the checkpoint was written, whose default is the
    behaviour the run had (a resume at another value is still refused)."""
    config = getattr(strategy, "config", None)
    if saved is None or not is_dataclass(config):
        return None if saved is None else dict(saved)
    later = {}
    for option in fields(config):
        if option.name in saved:
            continue
        if option.default is not MISSING:
            later[option.name] = option.default
        elif option.default_factory is not MISSING:
            later[option.name] = option.default_factory()
    return {**json.loads(json.dumps(later)), **saved}


def check_same_options(checkpoint: Checkpoint, strategy: "SupervisedTemplate", path: PathLike,
                       allow_changed: Collection[str] = ()) -> None:
    """Refuse to resume ``strategy`` from ``checkpoint`` written under other options, naming each."""
    if isinstance(allow_changed, str):
        raise ValueError(f"allow_changed must be a list of option names, got the string {allow_changed!r}; "
                         f"write allow_changed=[{allow_changed!r}]")
    current = recorded_options(strategy)
    if current is not None:
        unknown = sorted(set(allow_changed) - set(current))
        if unknown:
            raise ValueError(f"allow_changed names options this strategy does not have: {unknown}; "
                             f"its options are {sorted(current)}")
    problems = changed_options(with_later_defaults(checkpoint.options, strategy), current, allow_changed)
    if problems:
        names = [problem.partition(":")[0] for problem in problems]
        raise CheckpointError(
            f"checkpoint {path} was written by a run with other options: {'; '.join(problems)}. Resuming would "
            f"label the old run's results with the new options. Give the strategy the checkpoint's values, start "
            f"over (resume=False or another checkpoint path), or continue with the new values anyway: "
            f"train_stream(..., allow_changed={names!r})")


# ---------------------------------------------------------------------- the plugin

Record = dict[str, Any]


class ResumePlugin(SupervisedPlugin):
    """Save a CoLoR run to ``path`` after each training experience and every N epochs.

    Use it with a CoLoR strategy (its model an :class:`ExpertViT`), listed after
    the :class:`PrototypeRouterPlugin` (CoLoR puts that one first), so an
    experience's checkpoint holds its prototypes. Checkpoints at experience ends
    hold the learned state; those every ``every_n_epochs`` epochs also hold the
    optimiser and scheduler state, for a mid-experience resume.

    Args:
        path: the checkpoint file (written atomically, see :func:`write_checkpoint`).
        every_n_epochs: also save after every this many epochs inside an
            experience (default None: at experience ends only).

    Attributes:
        experiences_done: training experiences finished so far (the stream position).
        records: evaluation records so far, one per experience; saved with the run.
        stream_classes: each training experience's classes, saved so that a
            resume on another class set is refused (set by :func:`train_stream`).
    """

    def __init__(self, path: PathLike, every_n_epochs: Optional[int] = None) -> None:
        super().__init__()
        if every_n_epochs is not None:
            require("every_n_epochs", every_n_epochs, positive_int)
        self.path = Path(path)
        self.every_n_epochs = every_n_epochs
        self.experiences_done = 0
        self.records: list[Record] = []
        self.stream_classes: Optional[list[list[int]]] = None
        self._epochs_done = 0
        self._fingerprint: Optional[tuple[int, str]] = None  # (id of the model, digest): the backbone is frozen
        self._pending: Optional[Checkpoint] = None  # a mid-experience state to apply when training resumes
        self._full_train_epochs: Optional[int] = None
        self._epochs_skipped = 0
        self._earlier = (0.0, 0.0)  # (CPU, wall) seconds of the attempts before this one, from the checkpoint
        self._started = (time.process_time(), time.perf_counter())

    @property
    def earlier_seconds(self) -> tuple[float, float]:
        """The CPU and wall seconds the run's earlier attempts spent, as the checkpoint resumed recorded them
        ((0, 0) without a resume): add this attempt's for the run's whole cost."""
        return self._earlier

    def _spent(self) -> tuple[float, float]:
        """The run's CPU and wall seconds so far, over every attempt."""
        return (self._earlier[0] + time.process_time() - self._started[0],
                self._earlier[1] + time.perf_counter() - self._started[1])

    @property
    def epochs_skipped(self) -> int:
        """The current experience's epochs that finished before the resume, not trained again (0 where training
        did not resume inside it): a progress bar counts from there (:class:`~avalanche_color.TrainingProgress`)."""
        return self._epochs_skipped

    # ------------------------------------------------------------------ saving

    def save(self, strategy: "SupervisedTemplate", epochs_done: int = 0) -> None:
        """Write the run's state now: at an experience boundary, or ``epochs_done`` into the next one."""
        model = strategy.model
        mid_experience = epochs_done > 0
        scheduler = getattr(strategy, "lr_scheduler", None)
        cpu_seconds, wall_seconds = self._spent()
        write_checkpoint(self.path, Checkpoint(
            experiences_done=self.experiences_done,
            epochs_done=epochs_done,
            train_epochs=self._full_train_epochs or strategy.train_epochs,
            records=self.records,
            settings=model_settings(model),
            backbone=self._backbone_fingerprint(model),
            stream_classes=self.stream_classes,
            experts=model.experts_state_dict(),
            model_extras=model_extras(model),
            optimizer=strategy.optimizer.state_dict() if mid_experience else None,
            lr_scheduler=scheduler.state_dict() if mid_experience and scheduler is not None else None,
            rng=capture_rng(),
            options=recorded_options(strategy),
            cpu_seconds=cpu_seconds,
            wall_seconds=wall_seconds,
        ))

    def before_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        pending = self._pending
        if pending is None or strategy.experience.current_experience != pending.experiences_done:
            self._epochs_done = self._epochs_skipped = 0
            return
        # Resuming inside this experience: the optimiser was just rebuilt for its expert.
        strategy.optimizer.load_state_dict(pending.optimizer)
        if pending.lr_scheduler is not None and getattr(strategy, "lr_scheduler", None) is not None:
            strategy.lr_scheduler.load_state_dict(pending.lr_scheduler)
        self._epochs_done = self._epochs_skipped = pending.epochs_done
        self._full_train_epochs = strategy.train_epochs
        strategy.train_epochs = strategy.train_epochs - pending.epochs_done  # only the epochs left

    def before_training_epoch(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self._pending is not None and self._epochs_done == self._pending.epochs_done:
            # As late as possible: the next draw is this epoch's shuffle, as in the run that stopped.
            restore_rng(self._pending.rng)
            self._pending = None

    def after_training_epoch(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        self._epochs_done += 1
        total = self._full_train_epochs or strategy.train_epochs
        if self.every_n_epochs and self._epochs_done % self.every_n_epochs == 0 and self._epochs_done < total:
            self.save(strategy, epochs_done=self._epochs_done)

    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self._full_train_epochs is not None:
            strategy.train_epochs = self._full_train_epochs
            self._full_train_epochs = None
        self._epochs_skipped = 0
        self.experiences_done = int(strategy.experience.current_experience) + 1
        self.save(strategy)

    # ------------------------------------------------------------------ resuming

    def resume(self, strategy: "SupervisedTemplate", stream_classes: Optional[list[list[int]]] = None,
               allow_changed: Collection[str] = ()) -> Checkpoint:
        """Load the checkpoint at ``path`` into ``strategy`` (a fresh CoLoR strategy, no expert yet).

        The file, the model's settings, the backbone, (if given) the stream's classes and the
        strategy's other options (those not in :data:`OPTIONS_FREE_ON_RESUME` or ``allow_changed``)
        are all checked before anything changes; on any mismatch a :class:`CheckpointError` says
        what differs and the model stays as it was.
        A mid-experience state is applied when that experience's training starts.

        Returns:
            the checkpoint read (its ``experiences_done`` and ``records`` say where the run is).
        """
        model = strategy.model
        if not hasattr(model, "experts_state_dict"):
            raise TypeError(
                f"resume needs a CoLoR strategy (an ExpertViT model), got a {type(model).__name__} model"
            )
        if model.num_experts:
            raise ValueError(
                f"resume needs a fresh strategy whose model has no expert yet; this one has {model.num_experts}"
            )
        checkpoint = read_checkpoint(self.path)
        check_fits(checkpoint, model, self.path, stream_classes, self._backbone_fingerprint(model))
        check_same_options(checkpoint, strategy, self.path, allow_changed)
        if checkpoint.epochs_done and checkpoint.train_epochs != strategy.train_epochs:
            raise ValueError(
                f"checkpoint {self.path} stopped inside an experience of a run with train_epochs="
                f"{checkpoint.train_epochs}; this strategy has train_epochs={strategy.train_epochs}"
            )
        model.load_experts_state_dict({k: v.to(_device(model)) for k, v in checkpoint.experts.items()})
        restore_model_extras(model, checkpoint.model_extras)
        self.experiences_done = checkpoint.experiences_done
        self.records = list(checkpoint.records)
        self.stream_classes = checkpoint.stream_classes or stream_classes
        self._earlier = (checkpoint.cpu_seconds, checkpoint.wall_seconds)
        self._started = (time.process_time(), time.perf_counter())
        if checkpoint.epochs_done:
            self._pending = checkpoint
        else:
            restore_rng(checkpoint.rng)  # after loading: growing the model drew LoRA initialisations
        return checkpoint

    def _backbone_fingerprint(self, model: torch.nn.Module) -> str:
        if self._fingerprint is None or self._fingerprint[0] != id(model):
            self._fingerprint = (id(model), backbone_fingerprint(model))
        return self._fingerprint[1]


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


# ---------------------------------------------------------------------- the loop

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
    evaluate = evaluate or evaluate_seen(benchmark, loader_options)
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


def evaluate_seen(benchmark: Any, loader_options: Mapping[str, Any]) -> Evaluate:
    """train_stream's default evaluation: after experience i, the numeric metrics of the test experiences seen."""
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
