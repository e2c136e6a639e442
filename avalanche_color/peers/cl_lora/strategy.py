"""CL-LoRA as an Avalanche strategy (He, Duan, Zhu, "CL-LoRA: Continual Low-Rank Adaptation for
Rehearsal-Free Class-Incremental Learning", CVPR 2025; code JiangpengHe/CL-LoRA), and its training terms
as plain functions: the losses, the two steps of a batch, the class prototypes.

The model and each choice with its source: :mod:`avalanche_color.peers.cl_lora.model`. Training, from
``models/cllora.py``: per experience a fresh SGD (momentum, weight decay) over what trains, its rate
annealed per epoch to 0; the cross-entropy of the proxy head over the experience's classes; from the
second experience on, the distillation of the shared blocks and two SGD steps per batch
(:func:`two_step_gradients`); at the experience's end its class prototypes (:func:`experience_prototypes`),
then everything of it is frozen.
Our choices: both steps' gradients at the batch's parameters (the code's literal sequence fails on
current torch). Under torchrun the steps run without DDP: each step's gradients are averaged over the
ranks before it (:func:`~avalanche_color.training.distributed.average_gradients`), and the prototype
pass runs over the experience's whole data on every rank, so the ranks stay equal to one process.

**The losses** (``models/cllora.py`` and ``backbone/linears.py`` of the authors' code; the cosine proxy head
is the model's, :func:`~avalanche_color.peers.cl_lora.model.cosine_logits`): the distillation of the shared
blocks, the gradient reassignment of that distillation, and the orthogonality of the block weights.

**One batch** (``_init_train`` of ``models/cllora.py``; its schedule, ``CosineAnnealingLR`` stepped per epoch,
is the strategies' ``restart_cosine_per_epoch``). From the second experience on, the code takes two SGD
steps per batch on one optimiser: step 1 on the distillation loss alone, its gradient of each shared U
reassigned row by row; step 2 on the cross-entropy plus the orthogonality term. Its step 2 backpropagates
a graph built before step 1; current torch refuses that (the tensors it saved were changed in place), so
here both gradients are taken at the batch's parameters before step 1, which is what the code's graph
describes (:func:`two_step_gradients`). A parameter without a distillation gradient (the specific adapters,
the block weights) is left out of step 1, as SGD skips a ``None`` gradient: no decay, no momentum.

**The class prototypes** (``replace_fc`` of ``models/cllora.py``): per class of an experience, the mean raw
feature of its training images (evaluation transforms) under that experience's network, computed when the
experience ends and never updated (:func:`experience_prototypes`).
"""

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Optional, Sequence, Union

import torch
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.config import Precision
from avalanche_color.peers.cl_lora.config import CLLoRAConfig, SecondStepGradient
from avalanche_color.peers.cl_lora.model import CLLoRAViT
from avalanche_color.peers.lora_sum.strategy import LORA_SUM
from avalanche_color.training.distributed import average_gradients
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.training.strategy import Evaluator, StrategyBase
from avalanche_color.utils.experiences import ends_experience, origin_experience
from avalanche_color.utils.rng import generators_untouched


def distillation_loss(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """``-(1/B) Σ_b Σ_c softmax(z_T/T)_c log_softmax(z_S/T)_c`` (``_KD_loss``: no T², the teacher's
    logits not detached, so the loss also reaches the head through them)."""
    soft = torch.softmax(teacher / temperature, dim=1)
    return -(soft * torch.log_softmax(student / temperature, dim=1)).sum() / student.shape[0]


def reassignment_weights(teacher_up: Tensor) -> Tensor:
    """Per row i of the teacher's up projection U (..., d, r): ``d n_i / Σ_j n_j`` with ``n_i = ||U[i, :]||``
    (mean 1); the distillation gradient of the shared U is multiplied row by row by it. A teacher whose
    U is all zeros (no step ever taken) gives weights 1, where the code would divide 0 by 0."""
    norms = torch.linalg.vector_norm(teacher_up, dim=-1)
    total = norms.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, norms.shape[-1] * norms / torch.where(total > 0, total, 1), 1.0)


def orthogonality_loss(earlier: Sequence[Tensor], current: Tensor, eps: float = 1e-8) -> Tensor:
    """``mean_j |<w_j / (||w_j|| + eps), w / (||w|| + eps)>|`` over the flattened block weights (all three
    rows, the unused k row included: ``compute_orthogonality_loss``); 0 without earlier ones."""
    if not earlier:
        return current.new_zeros(())
    unit = current.flatten() / (torch.linalg.vector_norm(current.flatten()) + eps)
    dots = [(w.flatten() / (torch.linalg.vector_norm(w.flatten()) + eps) * unit).sum().abs() for w in earlier]
    return torch.stack(dots).mean()


Gradients = list[Optional[Tensor]]


def two_step_gradients(parameters: Sequence[nn.Parameter], loss: Tensor, kd_loss: Tensor,
                       shared_up: Sequence[nn.Parameter], teacher_up: Tensor) -> tuple[Gradients, Gradients]:
    """(step 1's gradients: the distillation's, reassigned; step 2's: ``loss``'s), both at the current
    parameters, in the order of ``parameters``."""
    second = list(torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True))
    first = list(torch.autograd.grad(kd_loss, parameters, allow_unused=True))
    position = {id(p): i for i, p in enumerate(parameters)}
    for index, up in enumerate(shared_up):
        i = position[id(up)]
        if first[i] is not None:
            first[i] = first[i] * reassignment_weights(teacher_up[index]).unsqueeze(-1).to(first[i].dtype)
    return first, second


def set_gradients(parameters: Sequence[nn.Parameter], gradients: Gradients) -> None:
    for parameter, gradient in zip(parameters, gradients):
        parameter.grad = gradient


def collate_options(dataset: Any) -> dict[str, Any]:
    """The data set's own collate function, as Avalanche's loaders take it."""
    collate: dict[str, Any] = {}
    collate_from_data_or_kwargs(dataset, collate)
    return collate


def experience_prototypes(model: CLLoRAViT, experience: int, batches: Iterable[Any]) -> Tensor:
    """:func:`class_means` in eval mode (then the mode as it was), the random generators left as they were."""
    was_training = model.training
    model.eval()
    try:
        with generators_untouched():
            return class_means(model, experience, batches, model.device)
    finally:
        model.train(was_training)


@torch.no_grad()
def class_means(model: CLLoRAViT, experience: int, batches: Iterable[Any], device: torch.device) -> Tensor:
    """(classes, features): the mean of ``model.experience_features`` per class of ``experience``, in the
    order of ``model.experiences.class_ids(experience)``; summed in float64. A class with no image keeps zeros."""
    classes = model.experiences.class_ids(experience)
    local = torch.full((max(classes) + 1,), -1, dtype=torch.long, device=device)
    local[classes] = torch.arange(len(classes), device=device)
    sums, counts = None, torch.zeros(len(classes), dtype=torch.float64, device=device)
    for batch in batches:
        x, y = batch[0].to(device), batch[1].to(device)
        features = model.experience_features(x, experience).double()
        keep = (y <= local.shape[0] - 1) & (local[y.clamp(max=local.shape[0] - 1)] >= 0)
        index = local[y[keep]]
        if sums is None:
            sums = features.new_zeros(len(classes), features.shape[1])
        sums.index_add_(0, index, features[keep])
        counts.index_add_(0, index, torch.ones_like(index, dtype=torch.float64))
    if sums is None:
        return model.experiences.prototypes.new_zeros(len(classes), model.experiences.prototypes.shape[1])
    return sums / counts.clamp_min(1).unsqueeze(1)


CL_LORA_PLUGINS = {**LORA_SUM, "LRSchedulerPlugin": (
    "the strategy builds a fresh SGD and its per-epoch cosine schedule per experience; a scheduler bound to "
    "another optimiser would be silently ignored")}


class CLLoRA(StrategyBase):
    """CL-LoRA on any timm ViT: task-shared LoRA kept by distillation, task-specific LoRA per experience.

    In the first ``shared_blocks`` blocks one LoRA on q and v (down projection a fixed orthonormal
    matrix) learns through the whole stream; from the second experience on, a distillation towards its
    state at the previous experience's end, with the gradient reweighted by that state's row norms,
    keeps it from drifting. The other blocks get a new LoRA and block weights per experience, frozen
    after it. A class is predicted by the cosine between the feature of the experience that trained it
    and that class's mean feature. Defaults: the authors' Split CIFAR-100 run. ``criterion`` is the loss of
    the proxy logits; ``eval_mb_size`` is also the batch size of the prototype pass.
    """

    model: CLLoRAViT
    config: CLLoRAConfig
    config_class: ClassVar[type[CLLoRAConfig]] = CLLoRAConfig
    model_class: ClassVar[type[CLLoRAViT]] = CLLoRAViT
    model_config_class: ClassVar[type[CLLoRAConfig]] = CLLoRAConfig
    incompatible_plugins = CL_LORA_PLUGINS
    optimizer_description = "SGD over the shared up projections, the new adapters, block weights and proxy head"
    optimizer_options = ("lr", "momentum", "weight_decay")
    # Not through DDP: two steps per batch from gradients taken with autograd.grad, which DDP's hooks
    # would not reduce; backward() averages them over the ranks itself.
    trains_distributed = False
    # In training: the distillation loss of the batch (step 1's), its student's and teacher's features.
    kd_loss: Optional[Tensor] = None
    _student: Optional[Tensor] = None
    _teacher: Optional[Tensor] = None

    def __init__(
        self,
        model: nn.Module,
        config: Optional[CLLoRAConfig] = None,
        *,
        rank: int = CLLoRAConfig.rank,
        shared_blocks: Optional[int] = CLLoRAConfig.shared_blocks,
        lr: float = CLLoRAConfig.lr,
        momentum: float = CLLoRAConfig.momentum,
        weight_decay: float = CLLoRAConfig.weight_decay,
        train_mb_size: int = CLLoRAConfig.train_mb_size,
        train_epochs: int = CLLoRAConfig.train_epochs,
        kd_weight: float = CLLoRAConfig.kd_weight,
        kd_temperature: float = CLLoRAConfig.kd_temperature,
        ortho_weight: float = CLLoRAConfig.ortho_weight,
        second_step_gradient: SecondStepGradient = CLLoRAConfig.second_step_gradient,
        init_seed: int = CLLoRAConfig.init_seed,
        # TrainingOptions
        eval_mb_size: int = CLLoRAConfig.eval_mb_size,
        eval_every: int = CLLoRAConfig.eval_every,
        check_data: bool = CLLoRAConfig.check_data,
        # PrecisionOptions
        precision: Precision = CLLoRAConfig.precision,
        # LoaderOptions
        num_workers: int = CLLoRAConfig.num_workers,
        pin_memory: Optional[bool] = CLLoRAConfig.pin_memory,
        persistent_workers: bool = CLLoRAConfig.persistent_workers,
        # Avalanche's (StrategyBase)
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """CL-LoRA on ``model``, with the options of ``config`` and those given here (the others: their
        defaults).

        Each option (``rank`` to ``persistent_workers``) is a field of
        :class:`~avalanche_color.peers.cl_lora.config.CLLoRAConfig`, documented there; its default is the config's.
        ``criterion``, ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``, of which the strategy builds its
                :class:`~avalanche_color.peers.cl_lora.model.CLLoRAViT` on a copy (the ViT given stays as it was);
                or a :class:`~avalanche_color.peers.cl_lora.model.CLLoRAViT` (a strategy's ``model``) to continue
                from: its own settings (``rank``, ``shared_blocks``) then apply, and one given another value is
                refused.
            config: all options as one :class:`~avalanche_color.peers.cl_lora.config.CLLoRAConfig`; an option given
                here replaces its field.
        """
        options = dict(
            rank=rank, shared_blocks=shared_blocks, lr=lr, momentum=momentum, weight_decay=weight_decay,
            train_mb_size=train_mb_size, train_epochs=train_epochs, kd_weight=kd_weight,
            kd_temperature=kd_temperature, ortho_weight=ortho_weight, second_step_gradient=second_step_gradient,
            init_seed=init_seed, eval_mb_size=eval_mb_size, eval_every=eval_every, check_data=check_data,
            precision=precision, num_workers=num_workers, pin_memory=pin_memory,
            persistent_workers=persistent_workers)
        super().__init__(model=model, config=config, options=options, criterion=criterion, device=device,
                         plugins=plugins, evaluator=evaluator, template_options=template_options)

    @classmethod
    def model_settings(cls) -> tuple[str, ...]:
        return cls.config_class.expert_setting_names()

    @classmethod
    def build_model(cls, vit: nn.Module, model_config: Any) -> nn.Module:
        return cls.model_class(vit, model_config)  # the model adapts a copy of the ViT itself

    def make_optimizer(self, **kwargs: Any) -> None:
        config = self.config
        self.optimizer = torch.optim.SGD(list(self.model.trainable_parameters()), lr=config.lr,
                                         momentum=config.momentum, weight_decay=config.weight_decay)
        self.restart_cosine_per_epoch()  # the code's CosineAnnealingLR(T_max=epochs), stepped per epoch

    # ------------------------------------------------------------------ one batch

    def forward(self) -> Tensor:
        """Training: the proxy logits (the distillation's student and teacher features kept for the loss);
        evaluation: the model's prototype logits."""
        if not self.is_training:
            return self.model(self.mb_x)
        outputs = self.model.training_outputs(self.mb_x)
        self._student, self._teacher = outputs.shared_features, None
        if self.model.training_experience() != 0:  # from the second experience on, there is a teacher
            with torch.no_grad():  # nothing of the teacher's branch trains before its head
                self._teacher = self.model.teacher_features(self.mb_x)
        return outputs.logits

    def criterion(self) -> Tensor:
        """Training: cross-entropy of the proxy logits, plus ``ortho_weight`` times the block weights'
        orthogonality (the distillation, kept in :attr:`kd_loss`, is step 1's); evaluation: cross-entropy."""
        loss = self._criterion(self.mb_output, self.mb_y)
        self.kd_loss = None
        if not self.is_training or self._teacher is None:
            return loss
        model, e = self.model, self.model.training_experience()
        assert e is not None
        self.kd_loss = self.config.kd_weight * distillation_loss(
            model.experiences.proxy_logits(self._student, e), model.experiences.proxy_logits(self._teacher, e),
            self.config.kd_temperature)
        ortho = orthogonality_loss(list(model.adapters.block_weights[:e]), model.adapters.block_weights[e])
        return loss + self.config.ortho_weight * ortho

    def _step_two_loss(self) -> Tensor:
        """Step 2's loss (cross-entropy and orthogonality) from a new forward at the current parameters."""
        model, e = self.model, self.model.training_experience()
        assert e is not None
        with self.autocast():
            loss = self._criterion(model.training_outputs(self.mb_x).logits, self.mb_y)
            ortho = orthogonality_loss(list(model.adapters.block_weights[:e]), model.adapters.block_weights[e])
            return loss + self.config.ortho_weight * ortho

    def backward(self) -> None:
        """The batch's gradients, under torchrun averaged over the ranks (one list per step). Each term is a
        mean over this rank's samples (the cross-entropy, the distillation) or the same on every rank (the
        orthogonality of the block weights), so the ranks' mean is the whole batch's gradient."""
        parameters = list(self.model.trainable_parameters())
        if self.kd_loss is None:
            super().backward()
            return set_gradients(parameters, average_gradients([p.grad for p in parameters]))
        bank = self.model.adapters
        first, second = two_step_gradients(parameters, self.loss, self.kd_loss,
                                           [adapter.up for adapter in bank.shared], bank.teacher_up)
        self._kd_gradients = average_gradients(first)
        set_gradients(parameters, average_gradients(second))  # what plugins see as the batch's gradient

    def optimizer_step(self) -> None:
        if self.kd_loss is None:
            return super().optimizer_step()
        parameters = list(self.model.trainable_parameters())
        second = [p.grad for p in parameters]
        set_gradients(parameters, self._kd_gradients)
        self.optimizer.step()  # step 1: the reassigned distillation gradient
        if self.config.second_step_gradient == "after_step_one":
            second = average_gradients(list(torch.autograd.grad(self._step_two_loss(), parameters,
                                                                allow_unused=True)))
        set_gradients(parameters, second)
        super().optimizer_step()  # step 2 (and the schedule's step)
        self._kd_gradients = []

    # ------------------------------------------------------------------ experience end

    def _after_training_exp(self, **kwargs: Any) -> None:
        # Prototypes and freezing before any plugin (checkpoint, evaluation) sees the experience's end.
        self._seen_samples = getattr(self, "_seen_samples", 0) + len(self.experience.dataset)
        if ends_experience(self.experience, self._seen_samples):
            e = self.model.training_experience()
            if e is not None:  # the code's train_loader_for_protonet: the training data, evaluation transforms
                dataset = origin_experience(self.experience).dataset.eval()
                loader = data_loader(dataset, loader_options(kwargs, self.config), self.device,
                                     batch_size=self.eval_mb_size, **collate_options(dataset))
                self.model.experiences.set_prototypes(e, experience_prototypes(self.model, e, loader))
            self.model.finish_experience()
            self._seen_samples = 0
        super()._after_training_exp(**kwargs)
