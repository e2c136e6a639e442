"""Bad data: refuse it before it can change what a strategy has learned.

One check for every strategy of the package (CoLoR, S-Prompts, L2P, SD-LoRA, InfLoRA: each
adds :class:`DataChecksPlugin` first among its plugins) and for the drop-in
:class:`~avalanche_color.LoRAExpertsPlugin`. What is checked, and how each case is handled:

* an experience with no samples, labels that are not integers, negative class ids,
  labels outside the experience's classes (as declared, else its targets'), images of a shape the
  backbone cannot take (channels, height, width), and NaN/inf pixels: a
  ``ValueError`` naming the experience, the sample index, the value found and
  what is allowed, raised by a scan of the experience's training data *before*
  its expert exists (the scan uses the training transforms, as the loader
  does, with the random generators saved and restored around it, so it does
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
  that costs nothing, it is read before every backward, so no weight takes the bad step. On a GPU it
  is read every :data:`GPU_LOSS_CHECK_EVERY` steps and at the end of every epoch
  (:class:`DeferredLossCheck`); in between, a step whose loss is not finite has its gradients
  zeroed on the device before the optimiser's step, so no NaN or inf reaches a weight, but up to
  that many steps run after the first bad one (momentum and weight decay still move the weights)
  before training stops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from avalanche.core import SupervisedPlugin
from torch import Tensor

from avalanche_color.training.data_scan import check_finite_images, check_training_experience, warn_sparse_class_ids
from avalanche_color.training.loaders import loader_options
from avalanche_color.training.loss_checks import GPU_LOSS_CHECK_EVERY, DeferredLossCheck, check_finite_loss
from avalanche_color.utils.experiences import experience_classes

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


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
