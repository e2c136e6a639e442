"""A word when an experience's training learns nothing: :class:`LearningCheck` (the bookkeeping and the rule, no
strategy needed), :class:`LearningCheckPlugin` (its Avalanche callbacks) and the :class:`ExpertLearnedNothing`
warning it gives.

A NaN or infinite loss stops training (:class:`~avalanche_color.DataChecksPlugin`); a finite loss that learns
nothing would go unsaid, and the run would simply score lower. So after each training experience this check
asks of what the experience trained (CoLoR's new expert, a fine-tuned model, ...) two questions, from the
outputs the training steps computed anyway (``strategy.mb_output`` and ``strategy.mb_y`` after each step: no
extra forward, and no host read until the experience ends):

* **Is its training accuracy better than chance?** Counted over the experience's last epoch, on the samples of
  the experience's own classes (a replay buffer's samples of other classes are left out), each predicted by the
  largest of its logits *over those classes only*. So every strategy is asked the same question, whether its
  experience has a head of its own (CoLoR, S-Prompts) or shares one over every class seen (fine-tuning, L2P, the
  LoRA peers): can it tell this experience's classes apart? Over a shared head's every column, predicting only
  the new classes would already beat "chance" without telling them apart. Chance is the share of the most
  frequent class among the samples counted, 1/classes on a balanced experience: what a constant prediction
  scores. The accuracy must exceed chance by ``noise_sigmas`` binomial standard deviations,
  ``sqrt(chance (1 - chance) / samples)``: a model that learned nothing scores about chance, give or take that
  spread, so below the line its accuracy is no evidence of learning (it stays under 2 standard deviations about
  98 times in 100). On a real experience the margin is small (5,000 samples of two classes: 1.4 points); on a few
  samples it is large, and where chance plus the margin reaches 100% the accuracy is not judged. The very first
  step of an experience is not counted: its forward ran the untrained weights.
* **Did its loss fall?** The mean cross-entropy of the same logits (the experience's classes, its own samples)
  over the last epoch must be below the first epoch's. This is the classification loss alone, the same for every
  strategy: EWC's penalty or LwF's distillation may rise while the experience is learned. With one epoch there
  is nothing to compare.

Where either fails, an :class:`ExpertLearnedNothing` warning (a ``UserWarning``) names the strategy, the
experience, the accuracy, chance, the loss of the first and last epochs and the learning rate (the optimiser's
first parameter group's, as set at the experience's start), and the finding is kept in
:attr:`LearningCheckPlugin.findings`. Not judged: an experience of one class (nothing to tell apart), outputs
that do not cover its class ids, and the chunks of an online stream without task boundaries; an online
experience with boundaries is judged once, over all its chunks, as one pass. A joint training counts as one
experience (its first's index) over every class of the stream. Under torchrun each rank judges its own shard.

Every strategy of the package adds the plugin (:class:`~avalanche_color.StrategyBase`; the training-free NCM and
RanPAC take no training steps, so it never judges them), and the comparison runner adds it to Avalanche's
strategies. To silence it, filter the warning (``warnings.filterwarnings("ignore", category=ExpertLearnedNothing)``);
to remove it, ``strategy.plugins.remove(learning_check(strategy))``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin
from torch import Tensor

from avalanche_color.utils.experiences import (continues_experience, ends_experience, experience_classes,
                                               is_online_chunk, origin_experience)

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate

# How many binomial standard deviations above chance a training accuracy must be to count as learned.
NOISE_SIGMAS = 2.0


class ExpertLearnedNothing(UserWarning):
    """What an experience trained is no better than chance on that experience, or its loss did not fall."""


@dataclass(frozen=True)
class LearnedNothing:
    """One experience whose training learned nothing, as :class:`LearningCheck` found it.

    ``accuracy`` and ``chance`` (fractions) are over the last epoch's ``samples`` (None where not judged);
    ``first_loss`` and ``last_loss`` are the mean cross-entropy of the first and last epochs (None with one
    epoch); ``at_chance`` and ``loss_did_not_fall`` say which test failed; ``lr`` is the learning rate the
    experience started with (None where no optimiser says it)."""

    experience: int
    accuracy: Optional[float]
    chance: Optional[float]
    margin: Optional[float]
    samples: int
    classes: int
    lr: Optional[float]
    first_loss: Optional[float]
    last_loss: Optional[float]
    at_chance: bool
    loss_did_not_fall: bool

    def record(self) -> dict[str, Any]:
        """The finding as plain values (a run's record in the comparison's results)."""
        return asdict(self)

    def message(self, strategy: str = "the strategy") -> str:
        """One line naming the experience, the accuracy, chance and the learning rate."""
        found = []
        if self.at_chance:
            found.append(f"training accuracy {self.accuracy:.1%} on its {self.classes} classes over the last epoch "
                         f"({self.samples} samples) is no better than chance ({self.chance:.1%}, noise margin "
                         f"{self.margin:.1%})")
        if self.loss_did_not_fall:
            found.append(f"its loss did not fall (first epoch {self.first_loss:.4g}, last {self.last_loss:.4g})")
        lr = "unknown" if self.lr is None else f"{self.lr:g}"
        return (f"{strategy}, experience {self.experience}: learned nothing: {'; '.join(found)}; lr {lr}. Try "
                f"another learning rate (a lower one if the loss rose or jumped), more epochs, or check the labels")


class _Epoch:
    """One epoch's sums, kept on the logits' device (read on the host only when the experience ends)."""

    def __init__(self) -> None:
        self.loss: Optional[Tensor] = None  # summed cross-entropy of the samples of the experience's classes
        self.correct: Optional[Tensor] = None  # of those counted for accuracy (every step but the first)
        self.per_class: Optional[Tensor] = None  # samples counted for accuracy, per class of the experience
        self.counted: Optional[Tensor] = None  # samples in the loss

    def add(self, loss: Tensor, counted: Tensor, correct: Optional[Tensor], per_class: Optional[Tensor]) -> None:
        self.loss = loss if self.loss is None else self.loss + loss
        self.counted = counted if self.counted is None else self.counted + counted
        if correct is not None and per_class is not None:
            self.correct = correct if self.correct is None else self.correct + correct
            self.per_class = per_class if self.per_class is None else self.per_class + per_class


class LearningCheck:
    """Whether an experience's training learned anything, from its training steps' logits and labels.

    Call :meth:`start` when the experience starts, :meth:`start_epoch` and :meth:`end_epoch` around each epoch,
    :meth:`observe` after each step, and :meth:`finish` after the experience: it returns a
    :class:`LearnedNothing` where the accuracy is no better than chance or the loss did not fall (the rule: see
    the module's docstring), else None.

    Args:
        noise_sigmas: how many binomial standard deviations above chance the accuracy must be.
    """

    def __init__(self, noise_sigmas: float = NOISE_SIGMAS) -> None:
        if not (isinstance(noise_sigmas, (int, float)) and not isinstance(noise_sigmas, bool)
                and math.isfinite(noise_sigmas) and noise_sigmas >= 0):
            raise ValueError(f"noise_sigmas must be a finite number >= 0, got {noise_sigmas!r}")
        self.noise_sigmas = float(noise_sigmas)
        self.start(0, [], None)

    def start(self, experience: int, classes: Sequence[int], lr: Optional[float]) -> None:
        """A new experience, of class ids ``classes``, trained at learning rate ``lr``."""
        self.experience, self.classes, self.lr = experience, sorted({int(c) for c in classes}), lr
        self.steps = 0
        self.first: Optional[_Epoch] = None
        self.last: Optional[_Epoch] = None
        self.epochs = 0
        self.current: Optional[_Epoch] = None
        self.judged = len(self.classes) >= 2  # one class: nothing to tell apart
        self._lookup: Optional[tuple[Tensor, Tensor]] = None

    def start_epoch(self) -> None:
        self.current = _Epoch()

    def observe(self, logits: Any, labels: Tensor) -> None:
        """One training step's ``logits`` (samples x classes, over the global class ids) and ``labels``."""
        step, self.steps = self.steps, self.steps + 1
        if not self.judged or self.current is None:
            return
        if not (isinstance(logits, Tensor) and logits.dim() == 2 and logits.shape[1] > self.classes[-1]):
            self.judged = False  # outputs that do not cover the experience's class ids: nothing to judge
            return
        with torch.no_grad():
            lookup, columns = self._class_lookup(labels.device)
            labels = labels.long()
            inside = labels.clamp(0, len(lookup) - 1)
            local = torch.where(labels <= self.classes[-1], lookup[inside], -1)  # index among the classes, or -1
            own = local >= 0
            restricted = logits.detach()[:, columns].float()
            target = local.clamp(min=0)
            loss = torch.where(own, F.cross_entropy(restricted, target, reduction="none"), 0.0).sum()
            correct = per_class = None
            if step > 0:  # the first step's forward ran the untrained weights
                hit = own & (restricted.argmax(dim=1) == target)
                correct = hit.sum()
                per_class = torch.zeros(len(self.classes), dtype=torch.long, device=labels.device).index_add_(
                    0, target, own.long())
            self.current.add(loss, own.sum(), correct, per_class)

    def end_epoch(self) -> None:
        if self.current is None:
            return
        if self.first is None:
            self.first = self.current
        self.last, self.current = self.current, None
        self.epochs += 1

    def finish(self) -> Optional[LearnedNothing]:
        """After the experience: what it learned nothing in, or None (all well, or nothing to judge)."""
        last = self.last
        if not self.judged or last is None or self.first is None or last.counted is None:
            return None  # nothing observed (a training-free strategy's epochs take no step)
        per_class = [] if last.per_class is None else last.per_class.tolist()  # the host reads, once
        samples = int(sum(per_class))
        accuracy = chance = margin = None
        at_chance = False
        if samples and last.correct is not None:  # counted together with per_class, from the second step on
            accuracy = float(last.correct) / samples
            chance = max(per_class) / samples
            margin = self.noise_sigmas * math.sqrt(chance * (1 - chance) / samples)
            at_chance = chance + margin < 1 and accuracy <= chance + margin
        first_loss = last_loss = None
        loss_did_not_fall = False
        first = self.first
        if (self.epochs >= 2 and first.loss is not None and first.counted is not None and last.loss is not None
                and int(first.counted) and int(last.counted)):
            first_loss = float(first.loss) / int(first.counted)
            last_loss = float(last.loss) / int(last.counted)
            loss_did_not_fall = not last_loss < first_loss
        if not (at_chance or loss_did_not_fall):
            return None
        return LearnedNothing(self.experience, accuracy, chance, margin, samples, len(self.classes), self.lr,
                              first_loss, last_loss, at_chance, loss_did_not_fall)

    def _class_lookup(self, device: torch.device) -> tuple[Tensor, Tensor]:
        # class id -> its index among the experience's classes (-1 for any other id up to the largest), and the
        # classes' ids: made once per experience on the labels' device
        if self._lookup is None or self._lookup[0].device != device:
            columns = torch.tensor(self.classes)
            lookup = torch.full((self.classes[-1] + 1,), -1, dtype=torch.long)
            lookup[columns] = torch.arange(len(self.classes))
            self._lookup = lookup.to(device), columns.to(device)
        return self._lookup


class LearningCheckPlugin(SupervisedPlugin, supports_distributed=True):
    """:class:`LearningCheck` on a strategy's training: warns with :class:`ExpertLearnedNothing` after an experience
    that learned nothing, and keeps what it found in :attr:`findings` (in the order of the experiences).

    Args:
        noise_sigmas: how many binomial standard deviations above chance the training accuracy must be.
    """

    def __init__(self, noise_sigmas: float = NOISE_SIGMAS) -> None:
        super().__init__()
        self.check = LearningCheck(noise_sigmas)
        self.findings: list[LearnedNothing] = []
        self._active = False
        self._online = False
        self._seen = 0  # the samples of an online experience's chunks so far

    def before_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        experience = strategy.experience
        self._online = is_online_chunk(experience)
        self._active = not self._online or bool(experience.access_task_boundaries)
        if not self._active:
            return
        if continues_experience(experience):
            self._seen += len(experience.dataset)
            return
        self._seen = len(experience.dataset)
        self.check.start(origin_experience(experience).current_experience, trained_classes(strategy),
                         starting_lr(strategy.optimizer))

    def before_training_epoch(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        # An online experience is one pass over its chunks: one epoch from its first chunk to its last.
        if self._active and not (self._online and self.check.current is not None):
            self.check.start_epoch()

    def after_training_iteration(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self._active:
            self.check.observe(strategy.mb_output, strategy.mb_y)

    def after_training_epoch(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if self._active and not self._online:
            self.check.end_epoch()

    def after_training_exp(self, strategy: "SupervisedTemplate", **kwargs: Any) -> None:
        if not self._active:
            return
        if self._online:
            if not ends_experience(strategy.experience, self._seen):
                return
            self.check.end_epoch()
        finding = self.check.finish()
        if finding is not None:
            self.findings.append(finding)
            warnings.warn(finding.message(type(strategy).__name__), ExpertLearnedNothing, stacklevel=2)


def trained_classes(strategy: Any) -> list[int]:
    """The class ids an experience trains on: its own, or for a joint training every experience's."""
    experiences = getattr(strategy, "_experiences", None)  # JointTraining's whole stream
    if not experiences:
        experiences = [origin_experience(strategy.experience)]
    return sorted({c for experience in experiences for c in experience_classes(experience)})


def starting_lr(optimizer: Any) -> Optional[float]:
    """The learning rate of ``optimizer``'s first parameter group as its schedule started (``initial_lr``, which
    torch's schedulers set), else its current one; None without one."""
    groups = getattr(optimizer, "param_groups", None) or [{}]
    lr = groups[0].get("initial_lr", groups[0].get("lr"))
    return None if lr is None else float(lr)


def learning_check(strategy: Any) -> Optional[LearningCheckPlugin]:
    """The :class:`LearningCheckPlugin` among ``strategy``'s plugins (None if it has none)."""
    return next((plugin for plugin in strategy.plugins if isinstance(plugin, LearningCheckPlugin)), None)
