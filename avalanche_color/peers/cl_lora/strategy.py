"""CL-LoRA as an Avalanche strategy (He, Duan, Zhu, "CL-LoRA: Continual Low-Rank Adaptation for
Rehearsal-Free Class-Incremental Learning", CVPR 2025; code JiangpengHe/CL-LoRA).

The model and each choice with its source: :mod:`avalanche_color.peers.cl_lora.model`. Training, from
``models/cllora.py``: per experience a fresh SGD (momentum, weight decay) over what trains, its rate
annealed per epoch to 0; the cross-entropy of the proxy head over the experience's classes; from the
second experience on, the distillation of the shared blocks and two SGD steps per batch
(:mod:`~avalanche_color.peers.cl_lora.steps`); at the experience's end its class prototypes
(:mod:`~avalanche_color.peers.cl_lora.prototypes`), then everything of it is frozen.
Our choices: both steps' gradients at the batch's parameters (the code's literal sequence fails on
current torch). Under torchrun the steps run without DDP: each step's gradients are averaged over the
ranks before it (:func:`~avalanche_color.training.distributed.average_gradients`), and the prototype
pass runs over the experience's whole data on every rank, so the ranks stay equal to one process.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional, Sequence, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.config import Precision
from avalanche_color.peers.cl_lora.config import CLLoRAConfig, SecondStepGradient
from avalanche_color.peers.cl_lora.losses import distillation_loss, orthogonality_loss
from avalanche_color.peers.cl_lora.model import CLLoRAViT
from avalanche_color.peers.cl_lora.prototypes import collate_options, experience_prototypes
from avalanche_color.peers.cl_lora.steps import set_gradients, two_step_gradients
from avalanche_color.peers.lora_sum.strategy import LORA_SUM
from avalanche_color.training.strategy import ConfiguredStrategy
from avalanche_color.training.distributed import average_gradients
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.utils.experiences import ends_experience, origin_experience

CL_LORA_PLUGINS = {**LORA_SUM, "LRSchedulerPlugin": (
    "the strategy builds a fresh SGD and its per-epoch cosine schedule per experience; a scheduler bound to "
    "another optimiser would be silently ignored")}


class CLLoRA(ConfiguredStrategy):
    """CL-LoRA on any timm ViT: task-shared LoRA kept by distillation, task-specific LoRA per experience.

    In the first ``shared_blocks`` blocks one LoRA on q and v (down projection a fixed orthonormal
    matrix) learns through the whole stream; from the second experience on, a distillation towards its
    state at the previous experience's end, with the gradient reweighted by that state's row norms,
    keeps it from drifting. The other blocks get a new LoRA and block weights per experience, frozen
    after it. A class is predicted by the cosine between the feature of the experience that trained it
    and that class's mean feature. Defaults: the authors' Split CIFAR-100 run.

    Args:
        model: a timm ``VisionTransformer`` (the strategy adapts a copy; the given ViT is unchanged),
            or a :class:`CLLoRAViT` to continue from: its expert settings then apply, and one
            given another value is refused.
        config: all options as one :class:`CLLoRAConfig`; options given beside it with a value other than
            their default replace its fields.
        rank: rank of every adapter (code: 8 on CIFAR-100, 10 on ImageNet-R).
        shared_blocks: how many first blocks hold the task-shared adapters; None: half of the blocks,
            rounded down (code: 6 of 12). At least one block must remain task-specific.
        lr: SGD's learning rate (code: 0.03 on CIFAR-100, 0.05 on ImageNet-R).
        momentum: SGD momentum (code: 0.9).
        weight_decay: SGD weight decay (code: 1e-4 on CIFAR-100, 5e-4 on ImageNet-R).
        train_mb_size: training mini-batch size (code: 64 on CIFAR-100, 32 on ImageNet-R).
        train_epochs: epochs per experience (code: 30 on CIFAR-100, 20 on ImageNet-R); the rate anneals
            per epoch as ``CosineAnnealingLR(T_max=train_epochs, eta_min=0)``.
        kd_weight: weight of the distillation of the shared blocks (code: 5).
        kd_temperature: its temperature (code: 2).
        ortho_weight: weight of the block weights' orthogonality term (code: 1e-4).
        second_step_gradient: where step 2's gradient (cross-entropy and orthogonality) is taken:
            ``"batch_start"``, at the batch's parameters, as the code's graph, built before step 1,
            describes; ``"after_step_one"``, from a new forward at the parameters step 1 left, the code's
            order read literally (its own sequence, which current torch refuses, mixes the two).
        eval_mb_size: evaluation mini-batch size, also of the prototype pass.
        eval_every: Avalanche's periodic evaluation (-1: none).
        precision: ``"32-true"`` (float32) or ``"bf16-mixed"`` (each forward and its losses under bfloat16
            autocast, the trained weights kept float32); ``"16-mixed"`` is refused. A ViT given in bfloat16
            stays so (half its memory); the trained weights are float32 beside it all the same.
        check_data: scan each training experience for bad samples before training on it.
        init_seed: seed of each experience's new weights (and of the shared adapters), drawn apart from
            the global generators: a resumed run and a fresh one draw the same.
        num_workers: DataLoader worker processes of every loader (0: in this process).
        pin_memory: page-locked batches; None: when the device is CUDA.
        persistent_workers: keep workers between epochs (needs ``num_workers`` >= 1).
        criterion: loss of the proxy logits; a new ``CrossEntropyLoss`` by default.
        device: where the model trains.
        plugins: Avalanche plugins (replay, distillation, regularisation and LR scheduler plugins are
            refused with the reason).
        evaluator: Avalanche's evaluation plugin.
        **kwargs: Avalanche's other ``SupervisedTemplate`` keywords (``peval_mode``, ...).
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
        *,
        config: Optional[CLLoRAConfig] = None,
        rank: int = 8,
        shared_blocks: Optional[int] = None,
        lr: float = 0.03,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        train_mb_size: int = 64,
        train_epochs: int = 30,
        kd_weight: float = 5.0,
        kd_temperature: float = 2.0,
        ortho_weight: float = 1e-4,
        second_step_gradient: SecondStepGradient = "batch_start",
        eval_mb_size: int = 128,
        eval_every: int = -1,
        precision: Precision = "32-true",
        check_data: bool = True,
        init_seed: int = 0,
        num_workers: int = 0,
        pin_memory: Optional[bool] = None,
        persistent_workers: bool = False,
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        **kwargs: Any,
    ) -> None:
        # Every option above, by name: the fields of CLLoRAConfig (tests/test_cl_lora.py).
        options = {name: value for name, value in locals().items() if name in CLLoRAConfig.names()}
        options, kwargs = self.checked_options(model, config, options, plugins, kwargs)
        super().__init__(model=model, config=CLLoRAConfig.build(config, **options), criterion=criterion,
                         device=device, plugins=plugins, evaluator=evaluator, template_options=kwargs)

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
