"""LoRA subtraction as an Avalanche strategy (Liu & Chang, "LoRA Subtraction for Drift-Resistant Space in
Exemplar-Free Continual Learning", CVPR 2025; code scarlet0703/LoRA-Sub-DRS at 836ad29), and what its
training uses: the passes over an experience's data, the principal projection, the authors' Adam, the
augmented triplet loss.

The model and each choice with its source: :mod:`avalanche_color.peers.lora_sub.model`. Training, from
``methods/lorasub_drs.py``: before every experience but the first, one pass over its training data
(no gradients) through the subtracted network measures each block's input covariance, whose
principal subspace (:func:`principal_projection`) confines the new component's Adam updates
(:class:`ProjectedAdam`); the loss is the cross-entropy over the experience's classes plus the
augmented triplet loss against the stored prototypes (:func:`augmented_triplet_loss`); after it, each
of its classes gets its mean feature (eval transforms) as a prototype, and evaluation is by the nearest
prototype.
Our choices: the passes run over the experience's whole data on every rank under torchrun and
leave the random generators as they were; the covariance is summed in float64; under torchrun the
triplet loss searches the batches of all ranks, as one process searches the whole batch.

The two no-gradient passes over one experience's whole training data (an online chunk's whole
experience), in eval mode, the random generators left as they were:

* before experience t > 0, with its training transforms, through the subtracted network: each block's
  input covariance (the code's ``get_cur_x`` pass over the training loader, :func:`subtracted_covariances`);
* after it, with its eval transforms, through the trained network: its classes' mean features (the
  code's ``_build_protos`` over each class's training images in ``mode='test'``,
  :func:`experience_class_means`): per new class, the mean raw feature of its training images under the
  network after the task, never updated later.
"""

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, ClassVar, Literal, Optional, Union, overload

import torch
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn
from torch.optim import Optimizer

from avalanche_color.config import Precision
from avalanche_color.peers.lora_sub.config import LoRASubtractionConfig, SameClassPrototypes, Schedule
from avalanche_color.peers.lora_sub.model import LoRASubtractionViT
from avalanche_color.peers.lora_sum.model import input_covariances
from avalanche_color.peers.lora_sum.strategy import LoRASumTemplate
from avalanche_color.training.distributed import gather_padded_rows
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.training.strategy import Evaluator
from avalanche_color.utils.experiences import origin_experience
from avalanche_color.utils.rng import generators_untouched


def experience_batches(strategy: Any, train: bool, **kwargs: Any) -> Iterator[tuple[Tensor, Tensor]]:
    """``(images, labels)`` of the strategy's experience, with its training or eval transforms, in order
    (batches of ``eval_mb_size``, the strategy's loader options)."""
    dataset = origin_experience(strategy.experience).dataset
    dataset = dataset.train() if train else dataset.eval()
    collate: dict[str, Any] = {}
    collate_from_data_or_kwargs(dataset, collate)
    loader = data_loader(dataset, loader_options(kwargs, strategy.config), strategy.device,
                         batch_size=strategy.eval_mb_size, **collate)
    for batch in loader:
        yield batch[0].to(strategy.device), batch[1].to(strategy.device)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode, no gradients, the random generators untouched; its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), generators_untouched():
            yield
    finally:
        model.train(was_training)


def subtracted_covariances(strategy: Any, **kwargs: Any) -> list[Tensor]:
    """Each adapted layer's mean ``x x^T`` (float64) over the experience's training data through the
    subtracted network (:meth:`LoRASubtractionViT.subtracted_mixing`)."""
    model = strategy.model
    mixing = model.subtracted_mixing()
    with evaluating(model), input_covariances(model.layers) as sums:
        for images, _ in experience_batches(strategy, train=True, **kwargs):
            model.features(images, mixing)
    return [total.mean() for total in sums]


def experience_class_means(strategy: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """``(classes, means)``: each class of the experience and its mean feature (float64) under the
    trained network, eval transforms, under the strategy's autocast (as its evaluation)."""
    model = strategy.model
    with evaluating(model), strategy.autocast():
        return class_means((model.features(images), labels)
                           for images, labels in experience_batches(strategy, train=False, **kwargs))


@torch.no_grad()
def class_means(batches: Iterable[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """``(classes, means)``: the classes present in ``(features, labels)`` batches, ascending, and the
    mean feature of each (summed in float64, returned in float64)."""
    total = count = None  # running (classes so far, d) sums and (classes so far,) counts
    for features, labels in batches:
        features = features.to(torch.float64)
        one_hot = nn.functional.one_hot(labels.to(features.device).long()).to(torch.float64)
        batch_total, batch_count = one_hot.T @ features, one_hot.sum(0)
        if total is None or count is None:
            total, count = batch_total, batch_count
            continue
        size = max(len(count), len(batch_count))
        total = _padded(total, size) + _padded(batch_total, size)
        count = _padded(count, size) + _padded(batch_count, size)
    if total is None or count is None:
        raise ValueError("class_means needs at least one batch")
    classes = torch.nonzero(count).flatten()
    return classes, total[classes] / count[classes, None]


def _padded(values: Tensor, size: int) -> Tensor:
    """``values`` with zero rows appended up to ``size`` rows."""
    return torch.cat((values, values.new_zeros(size - len(values), *values.shape[1:])))


def principal_projection(covariance: Tensor, threshold: float) -> tuple[Tensor, int]:
    """``(P, k)`` for one layer's (d, d) input covariance: ``P`` (d, d) in the covariance's dtype, the subspace a
    new task's updates are kept in: the principal directions of its inputs.

    From the authors' ``optimgrad/adam_proj.py`` (``get_eigens``, ``get_transforms``): per layer, the
    singular values ``s`` (descending) and vectors ``V`` of the input covariance of the subtracted
    network; ``k`` = 1 + the first index where ``cumsum(s) / sum(s)`` reaches the threshold (the
    singular values themselves, not their squares: for a covariance they are its eigenvalues); and
    ``P = V_k V_k^T / ||V_k V_k^T||_F``, whose norm ``sqrt(k)`` divides every projected step.

    A covariance whose energy never reaches ``threshold`` in floating point (or is all zero) keeps
    every direction, ``k = d``, where the code would fail on an empty index.
    """
    _, s, Vh = torch.linalg.svd(covariance)
    reached = torch.nonzero(s.cumsum(0) / s.sum() >= threshold)
    k = int(reached[0, 0]) + 1 if len(reached) else len(s)
    basis = Vh[:k].mT  # (d, k): the right singular vectors, as torch.svd's V
    outer = basis @ basis.mT
    return outer / torch.linalg.matrix_norm(outer), k


Side = Literal["right", "left"]  # A (r x d): u P; B (d x r): P u


class ProjectedAdam(Optimizer):
    """Adam as the LoRA-subtraction code computes it (``optimgrad/adam_proj.py``), with the old-style bias
    correction, and per-parameter projections of its update onto each layer's principal input subspace.

    Per step n of a parameter with gradient g (plus ``weight_decay * p`` when nonzero):
    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``step = lr sqrt(1 - b2^n) / (1 - b1^n)``, ``u = -step m / (sqrt(v) + eps)`` (torch's Adam would put eps
    after the bias correction). The moments see the raw gradient; the **update** is projected:
    ``A <- A + u P`` for a down matrix (its rows, the input side), ``B <- B + P u`` for an up matrix
    (its output side, with the same input-side P, as the code does). Parameters without a projection
    (the head, every parameter in the first experience) take ``u`` as it is.

    Args:
        params: parameters or parameter groups (each group may set ``lr`` and ``weight_decay``).
        lr, betas, eps, weight_decay: Adam's (weight decay as an L2 term added to the gradient).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.projections: dict[nn.Parameter, tuple[Tensor, Side]] = {}

    def project(self, parameter: nn.Parameter, projection: Tensor, side: Side) -> None:
        """From now on, project ``parameter``'s update by ``projection`` on ``side``."""
        self.projections[parameter] = (projection, side)

    # Optimizer.step's two forms: without a closure it returns None, with one the closure's loss.
    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if group["weight_decay"] == 0 else p.grad + group["weight_decay"] * p
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m, v, n = state["exp_avg"], state["exp_avg_sq"], state["step"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = group["lr"] * math.sqrt(1 - beta2 ** n) / (1 - beta1 ** n)
                update = -step_size * m / (v.sqrt() + group["eps"])
                if p in self.projections:
                    projection, side = self.projections[p]
                    projection = projection.to(update.dtype)
                    update = update @ projection if side == "right" else projection @ update
                p.add_(update)
        return loss


def augmented_triplet_loss(features: Tensor, labels: Tensor, prototypes: Tensor, prototype_classes: Tensor,
                           margin: float, same_class: SameClassPrototypes = "include",
                           real: Optional[Tensor] = None) -> Tensor:
    """The authors' augmented triplet loss (``utils/losses.py``, ``AugmentedTripletLoss``), vectorised: the loss
    of normalised ``features`` (n, d) with ``labels`` (n,), against ``prototypes`` (p, d) of
    ``prototype_classes`` (p,); ``p`` may be 0. ``real`` (n,), bool: the rows that count (None: all).

    For L2-normalised features ``f`` (n, d) with labels ``y``, and stored class prototypes:

    * ``D_ij = sqrt(max(||f_i||^2 + ||f_j||^2 - 2 f_i . f_j, 1e-12))`` (the expansion form: the diagonal is 1e-6);
    * the hardest positive ``ap_i = max_{j: y_j = y_i} D_ij`` (the anchor itself included);
    * the hardest negative ``an_i = min_{j: y_j != y_i} D_ij``, or ``ap_i + margin`` when the batch holds no
      other class; then ``an_i = min(an_i, min_c max(||f_i - c/||c||||, 1e-12))`` over the prototypes
      (constants), all of them as the code (``same_class="include"``), or all but the anchor's own
      class's (``"exclude"``, for streams where a class returns);
    * the loss ``mean_i max(0, ap_i - an_i + margin)`` (``nn.MarginRankingLoss`` with y = 1).

    Rows marked not ``real`` (the padding of a batch gathered from several ranks) are neither anchors nor
    candidates.
    """
    squares = features.square().sum(dim=1, keepdim=True)
    distances = (squares + squares.T - 2 * features @ features.T).clamp(min=1e-12).sqrt()
    same = labels[:, None] == labels[None, :]
    candidates = same.new_ones(()) if real is None else real[None, :]
    positive, negative = same & candidates, ~same & candidates
    positive.diagonal().fill_(True)  # the anchor itself: a padding row's too, so every term stays finite
    hardest_positive = distances.masked_fill(~positive, float("-inf")).amax(dim=1)
    hardest_negative = distances.masked_fill(~negative, float("inf")).amin(dim=1)
    hardest_negative = torch.where(negative.any(dim=1), hardest_negative, hardest_positive + margin)
    if len(prototypes):
        centres = (prototypes / prototypes.norm(dim=1, keepdim=True)).to(features.dtype).detach()
        # The direct form ||f_i - c||, as the code's torch.norm, without an (n, p, d) difference tensor.
        to_prototypes = torch.cdist(features, centres, compute_mode="donot_use_mm_for_euclid_dist").clamp(min=1e-12)
        if same_class == "exclude":
            to_prototypes = to_prototypes.masked_fill(labels[:, None] == prototype_classes[None, :], float("inf"))
        hardest_negative = torch.minimum(hardest_negative, to_prototypes.amin(dim=1))
    losses = torch.relu(hardest_positive - hardest_negative + margin)
    if real is None:
        return losses.mean()
    return (losses * real).sum() / real.sum()  # the mean over real anchors, without reading their count


class LoRASubtraction(LoRASumTemplate):
    """LoRA subtraction (drift-resistant space) on any timm ViT: each experience's LoRA learns in the
    principal input subspace of the network without the earlier LoRAs; prediction by class means.

    ``W = W0 + sum_{i<=t} B_i A_i`` on the key and value projections of every block. Before experience
    t > 0, its inputs through ``W0 - sum_{i<t} B_i A_i`` give each block's ``P``, and every Adam update of
    ``A_t`` and ``B_t`` is projected by it. Defaults: the authors' Split CIFAR-100 run. ``criterion`` is
    the cross-entropy part of the loss; ``eval_mb_size`` is also the batch size of the covariance and
    prototype passes.
    """

    model: LoRASubtractionViT
    config: LoRASubtractionConfig
    config_class: ClassVar[type[LoRASubtractionConfig]] = LoRASubtractionConfig
    model_class: ClassVar[type[LoRASubtractionViT]] = LoRASubtractionViT
    model_config_class: ClassVar[type[LoRASubtractionConfig]] = LoRASubtractionConfig
    optimizer_description = "the code's Adam, its updates projected, over the new component and the head"
    optimizer_options = ("lr", "head_lr", "weight_decay", "lr_schedule")

    # In training: the batch's features, for the triplet loss.
    mb_features: Optional[Tensor] = None

    def __init__(
        self,
        model: nn.Module,
        config: Optional[LoRASubtractionConfig] = None,
        *,
        rank: int = LoRASubtractionConfig.rank,
        threshold: float = LoRASubtractionConfig.threshold,
        margin: float = LoRASubtractionConfig.margin,
        triplet_weight: float = LoRASubtractionConfig.triplet_weight,
        same_class_prototypes: SameClassPrototypes = LoRASubtractionConfig.same_class_prototypes,
        lr: float = LoRASubtractionConfig.lr,
        head_lr: float = LoRASubtractionConfig.head_lr,
        weight_decay: float = LoRASubtractionConfig.weight_decay,
        lr_schedule: Schedule = LoRASubtractionConfig.lr_schedule,
        train_epochs: int = LoRASubtractionConfig.train_epochs,
        first_experience_epochs: Optional[int] = LoRASubtractionConfig.first_experience_epochs,
        init_seed: int = LoRASubtractionConfig.init_seed,
        # TrainingOptions
        train_mb_size: int = LoRASubtractionConfig.train_mb_size,
        eval_mb_size: int = LoRASubtractionConfig.eval_mb_size,
        eval_every: int = LoRASubtractionConfig.eval_every,
        check_data: bool = LoRASubtractionConfig.check_data,
        # PrecisionOptions
        precision: Precision = LoRASubtractionConfig.precision,
        # LoaderOptions
        num_workers: int = LoRASubtractionConfig.num_workers,
        pin_memory: Optional[bool] = LoRASubtractionConfig.pin_memory,
        persistent_workers: bool = LoRASubtractionConfig.persistent_workers,
        # Avalanche's (StrategyBase)
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """LoRA subtraction on ``model``, with the options of ``config`` and those given here (the others: their
        defaults).

        Each option (``rank`` to ``persistent_workers``) is a field of
        :class:`~avalanche_color.peers.lora_sub.config.LoRASubtractionConfig`, documented there; its default is the
        config's. ``criterion``, ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``, of which the strategy builds its
                :class:`~avalanche_color.peers.lora_sub.model.LoRASubtractionViT` on a copy (the ViT given stays as
                it was); or a :class:`~avalanche_color.peers.lora_sub.model.LoRASubtractionViT` (a strategy's
                ``model``) to continue from: its own settings (``rank``) then apply, and one given another value is
                refused.
            config: all options as one :class:`~avalanche_color.peers.lora_sub.config.LoRASubtractionConfig`; an
                option given here replaces its field.
        """
        options = dict(
            rank=rank, threshold=threshold, margin=margin, triplet_weight=triplet_weight,
            same_class_prototypes=same_class_prototypes, lr=lr, head_lr=head_lr, weight_decay=weight_decay,
            lr_schedule=lr_schedule, train_epochs=train_epochs, first_experience_epochs=first_experience_epochs,
            init_seed=init_seed, train_mb_size=train_mb_size, eval_mb_size=eval_mb_size, eval_every=eval_every,
            check_data=check_data, precision=precision, num_workers=num_workers, pin_memory=pin_memory,
            persistent_workers=persistent_workers)
        # Per experience after the first that this strategy prepared (not one resumed mid-way): k of each block.
        self.subspace_ranks: list[list[int]] = []
        super().__init__(model=model, config=config, options=options, criterion=criterion, device=device,
                         plugins=plugins, evaluator=evaluator, template_options=template_options)

    # ------------------------------------------------------------------ per experience

    def prepare_experience(self, **kwargs: Any) -> None:
        """After the first experience: each block's ``P`` from the subtracted network's inputs. With
        ``threshold=1.0`` nothing is projected, as in the code (which skips a threshold of 1)."""
        if self.model.num_experts < 2 or self.config.threshold == 1.0:
            self.model.set_projections([])
            return
        covariances = subtracted_covariances(self, **kwargs)
        bad = [index for index, covariance in enumerate(covariances) if not bool(torch.isfinite(covariance).all())]
        if bad:
            raise FloatingPointError(
                f"the inputs of the adapted layers {bad[:6]} became non-finite over experience "
                f"{self.experience.current_experience}'s training data in the subtracted network (before "
                f"iteration 0); stopped before any training step. Likely cause: pixels too large for the "
                f"backbone (normalise the images) or bad data")
        projections = [principal_projection(covariance, self.config.threshold) for covariance in covariances]
        self.model.set_projections([projection for projection, _ in projections])
        self.subspace_ranks.append([k for _, k in projections])

    def _before_training_exp(self, **kwargs: Any) -> None:
        # The code's init_epoch: the first experience (every chunk of it, on an online stream) runs its own
        # epoch count; set before the optimiser and its schedule are made for the experience.
        first_epochs = self.config.first_experience_epochs
        if first_epochs is not None:
            first = origin_experience(self.experience).current_experience == 0
            self.train_epochs = first_epochs if first else self.config.train_epochs
        super()._before_training_exp(**kwargs)

    def restart_epoch_cosine(self) -> None:
        """The code's per-epoch cosine; with ``first_experience_epochs``, of length ``train_epochs`` in the
        first experience too (the code's ``CosineSchedule(K=self.epochs)`` there as well)."""
        if self.config.first_experience_epochs is None:
            return super().restart_epoch_cosine()
        self.restart_epoch_cosine_over(self.config.train_epochs)

    def make_optimizer(self, **kwargs: Any) -> None:
        """The code's Adam over the current A and B (lr) and the head (head_lr); after the first experience
        every update of A is projected as ``u P``, of B as ``P u``; the schedule as ``lr_schedule``."""
        config, model = self.config, self.model
        head = [model.head_weight, model.head_bias]
        lora = [p for p in model.trainable_parameters() if all(p is not h for h in head)]
        self.optimizer = ProjectedAdam([{"params": lora, "lr": config.lr}, {"params": head, "lr": config.head_lr}],
                                       weight_decay=config.weight_decay)
        training = model.training_component()
        if len(model.projections) and training is not None:
            for layer, projection in zip(model.layers, model.projections):
                component = layer.components[training]
                self.optimizer.project(component.A, projection, "right")
                self.optimizer.project(component.B, projection, "left")
        self.restart_schedule()

    def conclude_component(self, **kwargs: Any) -> None:
        """The experience's prototypes: each of its classes' mean feature (eval transforms) under the
        trained network; its projections are no longer needed."""
        classes, means = experience_class_means(self, **kwargs)
        current = self.model.current_classes[classes.to(self.model.current_classes.device)]
        self.model.add_prototypes(classes[current], means[current])
        self.model.set_projections([])

    # ------------------------------------------------------------------ per step

    def forward(self) -> Tensor:
        """Training: the head's logits (the feature kept for the triplet loss); evaluation: nearest mean."""
        if not self.is_training:
            return self.step_model()(self.mb_x)
        logits, self.mb_features = self.step_model()(self.mb_x, with_features=True)
        return logits

    def criterion(self) -> Tensor:
        """Training: the cross-entropy over the current classes plus ``triplet_weight`` times the augmented
        triplet loss of the normalised features against the stored prototypes (under torchrun: over every
        rank's batch, :meth:`triplet_batch`). Evaluation: over every class."""
        loss = super().criterion()
        if not self.is_training or self.mb_features is None:
            return loss
        features = self.mb_features.to(torch.promote_types(self.mb_features.dtype, torch.float32))
        normalised, labels, real = self.triplet_batch(features / features.norm(dim=1, keepdim=True), self.mb_y)
        triplet = augmented_triplet_loss(normalised, labels, self.model.prototypes, self.model.prototype_classes,
                                         self.config.margin, self.config.same_class_prototypes, real)
        return loss + self.config.triplet_weight * triplet

    def triplet_batch(self, normalised: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """The triplet loss's batch: ``(features, labels, real rows)``. In one process this batch (None: every
        row real); under DDP every rank's batch, each padded to ``train_mb_size`` rows, so the hardest pairs
        are searched over the whole batch, as in one process.

        Why every sample is an anchor on every rank: each rank then computes the same loss L. The gather's
        backward sums into a rank's rows what all W ranks' L send them, W dL/df_r; DDP's mean of the ranks'
        parameter gradients, (1/W) sum_r W dL/df_r df_r/dθ, is dL/dθ, the one process's gradient. The
        cross-entropy stays local, a mean over this rank's samples that DDP's mean makes the batch's.
        """
        if self.ddp_model is None:
            return normalised, labels, None
        gathered, real = gather_padded_rows(normalised, self.train_mb_size)
        all_labels, _ = gather_padded_rows(labels, self.train_mb_size)
        return gathered, all_labels, real
