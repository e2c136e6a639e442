"""Bad data: refuse it before it can change what CoLoR has learned.

What is checked, and how each case is handled:

* an experience with no samples, negative class ids, labels outside the
  experience's classes (as declared, else its targets'), images of a shape the
  backbone cannot take (channels, height, width), and NaN/inf pixels: a
  ``ValueError`` naming the experience, the sample index, the value found and
  what is allowed, raised by a scan of the experience's training data *before*
  its expert exists (the scan uses the training transforms, as the loader
  does, with the random generators saved and restored around it, so it does
  not change the run's randomness). Nothing is created or changed.
* NaN/inf pixels in an evaluation batch: a ``ValueError`` before the forward
  pass (routing a NaN feature would pick an arbitrary expert).
* a loss that turns NaN or inf during training: a ``FloatingPointError``
  before the backward pass, so no weight takes the bad step. Earlier experts
  and all prototypes are unchanged (they are frozen); the failing
  experience's expert stays as after its last finite step and has no
  prototypes yet, so it is never routed to. Resume from the last checkpoint
  (:func:`avalanche_color.train_stream`) after fixing the cause (learning rate, data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from avalanche.core import SupervisedPlugin
from torch import Tensor

from avalanche_color.experts.backbone import backbone_images
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.utils.checks import positive_int, require
from avalanche_color.utils.experiences import experience_classes
from avalanche_color.utils.rng import generators_untouched

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


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
                if label.numel() != 1 or label.is_floating_point() or not bool(torch.isin(label.long(), allowed)):
                    raise ValueError(
                        f"{where}: label must be one of the experience's declared classes {declared}, "
                        f"got {label.tolist()!r}"
                    )
                index += 1


def check_finite_images(images: Tensor, where: str) -> None:
    """Refuse a batch with NaN or infinite pixels."""
    if not bool(torch.isfinite(images).all()):
        rows = (~torch.isfinite(images.reshape(len(images), -1))).any(dim=1).nonzero().flatten()
        raise ValueError(
            f"{where}: images must have finite pixels, got {_non_finite(images)} "
            f"in batch rows {rows.tolist()[:10]}"
        )


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


class DataChecksPlugin(SupervisedPlugin, supports_distributed=True):
    """Run the checks above at the right moments of an Avalanche strategy.

    CoLoR adds it first among its plugins, so an experience is refused before
    any other plugin or the model adaptation acts on it.

    Args:
        scan_experiences: scan each training experience's samples before
            training on it (one extra pass over its data, without the model).
            With False, only empty experiences, evaluation pixels and the loss are checked.
    """

    def __init__(self, scan_experiences: bool = True) -> None:
        super().__init__()
        self.scan_experiences = scan_experiences

    def before_train_dataset_adaptation(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        experience = strategy.experience
        if not self.scan_experiences:
            if len(experience.dataset) == 0:
                raise ValueError(f"experience {experience.current_experience} has no training samples")
            return
        vit = getattr(strategy.model, "backbone", strategy.model)
        check_training_experience(experience, vit, strategy.eval_mb_size or strategy.train_mb_size,
                                  loader_options(kwargs).num_workers)

    def before_backward(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        clock = strategy.clock
        heads = getattr(strategy.model, "heads", None)
        check_finite_loss(strategy.loss, f"experience {strategy.experience.current_experience}, epoch "
                                         f"{clock.train_exp_epochs}, iteration {clock.train_epoch_iterations}",
                          strategy.mb_y, heads[-1].classes if heads else None)

    def before_eval_forward(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        check_finite_images(strategy.mb_x, f"evaluation on experience {strategy.experience.current_experience}")


def _non_finite(images: Tensor) -> str:
    nan = int(torch.isnan(images).sum())
    inf = int(torch.isinf(images).sum())
    return f"{nan} NaN and {inf} infinite values"

