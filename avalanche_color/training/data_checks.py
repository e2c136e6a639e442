"""Bad data: refuse it before it can change what a strategy has learned: the data checks plugin,
the scan of the data it runs, and the checks of the training loss.

One check for every strategy of the package (CoLoR, S-Prompts, L2P, SD-LoRA, InfLoRA: each
adds :class:`DataChecksPlugin` first among its plugins) and for the drop-in
:class:`~avalanche_color.LoRAExpertsPlugin`. What is checked, and how each case is handled:

* an experience with no samples, labels that are not integers, negative class ids,
  labels outside the experience's classes (as declared, else its targets'), images of a shape the
  backbone cannot take (channels, height, width), and NaN/inf pixels: a
  ``ValueError`` naming the experience, the sample index, the value found and
  what is allowed, raised by a scan of the experience's training data *before*
  its expert exists (:func:`check_training_experience`: the scan uses the training transforms, as the
  loader does, with the random generators saved and restored around it, so it does
  not change the run's randomness). Nothing is created or changed.
* class ids far above the number of classes seen (the largest at least 1000 and more than
  10 times the distinct classes): accepted, with a ``UserWarning`` (:func:`warn_sparse_class_ids`).
* NaN/inf pixels in an evaluation batch: a ``ValueError`` before the forward
  pass (routing a NaN feature would pick an arbitrary expert).
* a loss that turns NaN or inf during training: a ``FloatingPointError`` naming the experience,
  epoch and iteration where it first did. Earlier experts and all prototypes are unchanged (they
  are frozen); the failing experience's expert has no prototypes yet, so it is never routed to.
  Resume from the last checkpoint (:func:`avalanche_color.train_stream`) after fixing the cause
  (learning rate, data). When the loss is read is a trade-off (``loss_check_every``): reading it
  on the host is a sync that stalls a GPU until its queue drains, every step. On the CPU, where
  that costs nothing, it is read before every backward (:func:`check_finite_loss`), so no weight
  takes the bad step. On a GPU it is read every :data:`GPU_LOSS_CHECK_EVERY` steps and at the end of
  every epoch (:class:`DeferredLossCheck`); in between, a step whose loss is not finite has its gradients
  zeroed on the device before the optimiser's step, so no NaN or inf reaches a weight, but up to
  that many steps run after the first bad one (momentum and weight decay still move the weights)
  before training stops.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Optional

import torch
from avalanche.core import SupervisedPlugin
from torch import Tensor

from avalanche_color.experts.routed_vit import backbone_images
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.utils.checks import positive_int, require
from avalanche_color.utils.experiences import experience_classes
from avalanche_color.utils.rng import generators_untouched

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate

# ---------------------------------------------------------------------- the data


def check_training_experience(experience: Any, vit: Any, batch_size: int = 256, num_workers: int = 0) -> None:
    """Refuse an experience CoLoR cannot learn from, naming the first bad sample.

    Args:
        experience: an Avalanche training experience.
        vit: the timm ViT the images go to (its patch embedding says what it takes).
        batch_size: samples loaded at a time by the scan.
        num_workers: worker processes loading them (0: this process).
    """
    require("batch_size", batch_size, positive_int)
    options = loader_options({"num_workers": num_workers})
    experience_id = experience.current_experience
    dataset = experience.dataset.train()
    if len(dataset) == 0:
        raise ValueError(
            f"experience {experience_id} has no training samples; every training experience needs "
            f"at least one (and at least k for its prototypes)"
        )
    declared = experience_classes(experience)
    if declared and declared[0] < 0:
        raise ValueError(f"experience {experience_id} declares classes {declared}; class ids must be >= 0")
    allowed = torch.tensor(declared, dtype=torch.long)
    checked_shape = None
    index = 0
    with generators_untouched():
        for samples in data_loader(dataset, options, torch.device("cpu"), batch_size=batch_size, collate_fn=list):
            for sample in samples:
                image, label = torch.as_tensor(sample[0]), torch.as_tensor(sample[1])
                where = f"experience {experience_id}, sample {index}"
                if image.shape != checked_shape:
                    try:
                        backbone_images(vit, image.unsqueeze(0))  # refuses what the backbone cannot take
                    except ValueError as error:
                        raise ValueError(f"{where}: {error}") from None
                    checked_shape = image.shape
                if not bool(torch.isfinite(image).all()):
                    raise ValueError(f"{where}: images must have finite pixels, got {_non_finite(image)}")
                if label.numel() != 1 or label.is_floating_point() or label.dtype == torch.bool:
                    raise ValueError(
                        f"{where}: labels must be integer class ids (one per sample), got {label.tolist()!r} "
                        f"of dtype {label.dtype}; convert them, e.g. torch.as_tensor(labels).long()"
                    )
                if int(label) < 0:
                    raise ValueError(f"{where}: labels must be class ids >= 0, got {int(label)}")
                if not bool(torch.isin(label.long(), allowed)):
                    raise ValueError(
                        f"{where}: label must be one of the experience's declared classes {declared}, "
                        f"got {label.tolist()!r}"
                    )
                index += 1


# Class ids far above the number of classes: a warning from this largest id on (see warn_sparse_class_ids).
SPARSE_CLASS_ID = 1000
# ... when the largest id is more than this many times the number of distinct classes seen.
SPARSE_CLASS_RATIO = 10


def warn_sparse_class_ids(experience_id: int, classes: Sequence[int], seen: Iterable[int] = ()) -> None:
    """Warn when class ids run far above the classes seen: the outputs grow with the largest id.

    Every strategy's output covers class ids 0 to the largest seen, and the heads of SD-LoRA and
    L2P hold a row per id, so labels such as 100000 for a handful of classes cost millions of
    parameters for nothing. Such ids are allowed (a subset of a large label space is valid), but
    when the largest id is at least :data:`SPARSE_CLASS_ID` (1000) and more than
    :data:`SPARSE_CLASS_RATIO` (10) times the number of distinct classes seen so far (this
    experience's included), a ``UserWarning`` names the experience and the ids.
    """
    known = set(seen) | set(classes)
    if not classes or not known:
        return
    largest = max(classes)
    if largest >= SPARSE_CLASS_ID and largest + 1 > SPARSE_CLASS_RATIO * len(known):
        warnings.warn(
            f"experience {experience_id} has class ids up to {largest}, but only {len(known)} distinct classes "
            f"have been seen; outputs cover every id from 0 to {largest} (SD-LoRA's and L2P's heads hold a "
            f"row of parameters per id). If the ids are not meant to be that sparse, map them to "
            f"0..{len(known) - 1} before building the benchmark",
            UserWarning, stacklevel=2)


def check_finite_images(images: Tensor, where: str) -> None:
    """Refuse a batch with NaN or infinite pixels."""
    if not bool(torch.isfinite(images).all()):
        rows = (~torch.isfinite(images.reshape(len(images), -1))).any(dim=1).nonzero().flatten()
        raise ValueError(
            f"{where}: images must have finite pixels, got {_non_finite(images)} "
            f"in batch rows {rows.tolist()[:10]}"
        )


def _non_finite(images: Tensor) -> str:
    nan = int(torch.isnan(images).sum())
    inf = int(torch.isinf(images).sum())
    return f"{nan} NaN and {inf} infinite values"


# ---------------------------------------------------------------------- the loss

# On a GPU the loss is read on the host every this many training steps (see the module docstring).
GPU_LOSS_CHECK_EVERY = 50


def check_finite_loss(loss: Tensor, where: str, labels: Optional[Tensor] = None,
                      head_classes: Optional[Tensor] = None) -> None:
    """Stop training on a NaN or infinite loss, before it reaches any weight.

    With the batch's ``labels`` and the classes of the head being trained, a
    batch holding labels outside the head (its logits there are -inf) is named as the cause.
    """
    if bool(torch.isfinite(loss).all()):
        return
    outside = []
    if labels is not None and head_classes is not None:
        outside = sorted(set(labels.unique().tolist()) - set(head_classes.tolist()))
    if outside:
        cause = (f"the batch holds labels {outside} outside the classes {head_classes.tolist()} of the expert being "
                 f"trained, whose logits there are -inf. Each expert learns its own experience's classes only: "
                 f"something added samples of other experiences to this one (a replay or memory plugin, or a "
                 f"custom loader); train on each experience's own data")
    else:
        cause = "lower the learning rate or check the data"
    raise FloatingPointError(
        f"the training loss became {loss.detach().flatten().tolist()[:4]} at {where}; stopped before "
        f"the backward pass, so no weight took this step. Earlier experts and prototypes are unchanged; "
        f"this experience's expert is unfinished. Likely cause: {cause}; then resume from the last checkpoint"
    )


class DeferredLossCheck:
    """The training loss's finiteness, watched on its device and read on the host every ``every`` steps.

    :meth:`add` keeps, on the loss's device, the index of the first step whose loss was not finite
    (no host sync) and, on the host, where each step was; :meth:`check` reads that index (one
    sync) and raises a ``FloatingPointError`` naming where the first bad step was.
    """

    def __init__(self, every: int) -> None:
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.every = every
        self.first_bad: Optional[Tensor] = None
        self.places: list[str] = []

    def add(self, loss: Tensor, where: str) -> Tensor:
        """Watch this step's loss; returns whether it is not finite, as a 0-d bool tensor on its device."""
        bad = ~torch.isfinite(loss.detach()).all()
        if self.first_bad is None:
            self.first_bad = torch.full((), -1, dtype=torch.long, device=loss.device)
        self.first_bad = torch.where(bad & (self.first_bad < 0), len(self.places), self.first_bad)
        self.places.append(where)
        return bad

    @property
    def due(self) -> bool:
        return len(self.places) >= self.every

    def check(self) -> None:
        """Raise if a step since the last check had a non-finite loss; then start over."""
        if not self.places or self.first_bad is None:
            return
        first, places = int(self.first_bad), self.places  # the one host sync
        self.first_bad, self.places = None, []
        if first >= 0:
            raise FloatingPointError(
                f"the training loss became non-finite at {places[first]}; read {len(places) - first - 1} steps "
                f"later (it is read every {self.every} steps on a GPU: a read stalls the GPU), and those steps' "
                f"gradients were zeroed, so no NaN or inf reached a weight. Earlier experts and prototypes are "
                f"unchanged; this experience's expert is unfinished. Likely cause: lower the learning rate or "
                f"check the data (loss_check_every=1 stops at the bad step itself); then resume from the last "
                f"checkpoint")


# ---------------------------------------------------------------------- the plugin


class DataChecksPlugin(SupervisedPlugin, supports_distributed=True):
    """Run the checks above at the right moments of an Avalanche strategy.

    CoLoR adds it first among its plugins, so an experience is refused before
    any other plugin or the model adaptation acts on it.

    Args:
        scan_experiences: scan each training experience's samples before
            training on it (one extra pass over its data, without the model).
            With False, only empty experiences, evaluation pixels and the loss are checked.
        loss_check_every: read the training loss on the host every this many steps (and at each
            epoch's end); None: every step on the CPU, every :data:`GPU_LOSS_CHECK_EVERY` on a GPU
            (the trade-off: see the module docstring).
    """

    def __init__(self, scan_experiences: bool = True, loss_check_every: Optional[int] = None) -> None:
        super().__init__()
        self.scan_experiences = scan_experiences
        if loss_check_every is not None and not (isinstance(loss_check_every, int) and loss_check_every >= 1):
            raise ValueError(f"loss_check_every must be an integer >= 1 or None, got {loss_check_every!r}")
        self.loss_check_every = loss_check_every
        self.deferred: Optional[DeferredLossCheck] = None
        self._bad_step: Optional[Tensor] = None
        self.seen_classes: set[int] = set()  # the class ids of the experiences trained, for warn_sparse_class_ids

    def before_train_dataset_adaptation(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        experience = strategy.experience
        if not self.scan_experiences:
            if len(experience.dataset) == 0:
                raise ValueError(f"experience {experience.current_experience} has no training samples")
        else:
            vit = getattr(strategy.model, "backbone", strategy.model)
            check_training_experience(experience, vit, strategy.eval_mb_size or strategy.train_mb_size,
                                      loader_options(kwargs).num_workers)
        classes = experience_classes(experience)
        warn_sparse_class_ids(experience.current_experience, classes, self.seen_classes)
        self.seen_classes.update(classes)

    def before_backward(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        clock = strategy.clock
        where = (f"experience {strategy.experience.current_experience}, epoch {clock.train_exp_epochs}, "
                 f"iteration {clock.train_epoch_iterations}")
        every = self.loss_check_every or (1 if torch.device(strategy.device).type == "cpu" else GPU_LOSS_CHECK_EVERY)
        if every == 1:
            heads = getattr(strategy.model, "heads", None)
            check_finite_loss(strategy.loss, where, strategy.mb_y, heads[-1].classes if heads else None)
            return
        if self.deferred is None or self.deferred.every != every:
            self.deferred = DeferredLossCheck(every)
        self._bad_step = self.deferred.add(strategy.loss, where)
        if self.deferred.due:
            self.deferred.check()

    def before_update(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        # A step whose loss was not finite, not read yet: its gradients are zeroed on the device.
        bad, self._bad_step = self._bad_step, None
        if bad is None:
            return
        for group in strategy.optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    parameter.grad.masked_fill_(bad, 0)

    def after_training_epoch(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self.deferred is not None:
            self.deferred.check()

    def before_eval_forward(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        check_finite_images(strategy.mb_x, f"evaluation on experience {strategy.experience.current_experience}")
