"""Joint-LoRA: one CoLoR expert trained on the whole stream at once, as CoLoR trains an expert (the
upper bound of a LoRA expert that sees every class together)."""

import copy
from collections.abc import Sequence
from typing import Any, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training import JointTraining
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.baselines.options import JointLoRAOptions
from avalanche_color.color.model import ExpertViT
from avalanche_color.config import Precision
from avalanche_color.experts.routed_vit import check_vision_transformer
from avalanche_color.training.data_checks import check_training_experience
from avalanche_color.training.loaders import loader_options
from avalanche_color.training.strategy import Evaluator, StrategyBase
from avalanche_color.utils.experiences import experience_classes


class SingleLoRAExpert(nn.Module):
    """Joint-LoRA's model: CoLoR's :class:`~avalanche_color.ExpertViT` with a single expert, its head over
    ``classes``.

    One CoLoR expert (rank-r LoRA on q and v of every block of the frozen ViT) trained on the
    whole stream; with one expert there is nothing to route, so it always predicts.
    """

    def __init__(self, vit: nn.Module, rank: int, classes: Sequence[int]) -> None:
        super().__init__()
        self.experts = ExpertViT(vit, rank=rank)
        self.experts.start_expert(list(classes), experience=0)

    @property
    def backbone(self) -> nn.Module:
        """The ViT (with its LoRA layers), whose patch embedding says which images it takes."""
        return self.experts.backbone

    def forward(self, x: Tensor) -> Tensor:
        return self.experts.predict(x, 0)


class JointLoRA(StrategyBase, JointTraining):
    """Joint-LoRA: Avalanche's ``JointTraining`` of one CoLoR expert on all experiences at once.

    The expert is rank-``rank`` LoRA on the query and value projections of every block of a frozen
    copy of the ViT, with a linear head over class ids ``0 .. num_classes - 1``
    (:class:`SingleLoRAExpert`); it trains as CoLoR trains an expert: SGD over the expert's
    parameters only, with momentum and weight decay, the learning rate annealed to zero by a cosine
    over all steps. ``train`` is called once, with the whole stream (Avalanche's ``JointTraining``).
    An upper bound for CoLoR: one expert that sees every class together, with nothing to route.
    The options' defaults are CoLoR's (:class:`~avalanche_color.baselines.options.JointLoRAOptions`).
    """

    config_class = JointLoRAOptions
    config: JointLoRAOptions
    model: SingleLoRAExpert
    avalanche_template = JointTraining
    optimizer_description = "SGD over the expert, cosine-annealed over all steps"
    optimizer_options = ("lr", "momentum", "weight_decay")

    def __init__(
        self,
        model: nn.Module,
        config: Optional[JointLoRAOptions] = None,
        *,
        num_classes: int = JointLoRAOptions.num_classes,
        rank: int = JointLoRAOptions.rank,
        lr: float = JointLoRAOptions.lr,
        momentum: float = JointLoRAOptions.momentum,
        weight_decay: float = JointLoRAOptions.weight_decay,
        train_epochs: int = JointLoRAOptions.train_epochs,
        # BaselineOptions
        check_data: bool = JointLoRAOptions.check_data,
        train_mb_size: int = JointLoRAOptions.train_mb_size,
        eval_mb_size: int = JointLoRAOptions.eval_mb_size,
        # PrecisionOptions
        precision: Precision = JointLoRAOptions.precision,
        # Avalanche's (StrategyBase)
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """Joint-LoRA on ``model``, with the options of ``config`` and those given here (the others: their
        defaults).

        Each option (``num_classes`` to ``precision``) is a field of
        :class:`~avalanche_color.baselines.options.JointLoRAOptions`, documented there; its default is the config's.
        ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``; a copy is adapted (the model given is not changed).
            config: all options as one :class:`~avalanche_color.baselines.options.JointLoRAOptions`; an option given
                here replaces its field.
        """
        options = dict(
            num_classes=num_classes, rank=rank, lr=lr, momentum=momentum, weight_decay=weight_decay,
            train_epochs=train_epochs, check_data=check_data, train_mb_size=train_mb_size,
            eval_mb_size=eval_mb_size, precision=precision)
        super().__init__(model=model, config=config, options=options, device=device, plugins=plugins,
                         evaluator=evaluator, template_options=template_options)

    def make_model(self, model: nn.Module) -> SingleLoRAExpert:
        check_vision_transformer(model)
        return SingleLoRAExpert(copy.deepcopy(model), self.config.rank, range(self.config.num_classes))

    def template_settings(self, model: nn.Module) -> dict[str, Any]:
        config = self.config
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                    momentum=config.momentum, weight_decay=config.weight_decay)
        return dict(optimizer=optimizer, train_mb_size=config.train_mb_size, train_epochs=config.train_epochs,
                    eval_mb_size=config.eval_mb_size)

    def scans_experiences(self) -> bool:
        # The data scan is done in train_dataset_adaptation, over every experience (the plugin would see the first
        # alone).
        return False

    def train_dataset_adaptation(self, **kwargs: Any) -> None:
        for experience in self._experiences:  # the head is fixed: labels it cannot hold fail mid-training
            largest = max(experience_classes(experience), default=-1)
            if largest >= self.config.num_classes:
                raise ValueError(f"num_classes={self.config.num_classes} cannot hold the labels of experience "
                                 f"{experience.current_experience}: its class ids go up to {largest}, so num_classes "
                                 f"must be at least {largest + 1}")
        if self.config.check_data:
            for experience in self._experiences:
                check_training_experience(experience, self.model.backbone, self.eval_mb_size or self.train_mb_size,
                                          loader_options(kwargs).num_workers)
        super().train_dataset_adaptation(**kwargs)

    def model_adaptation(self, model: Optional[nn.Module] = None) -> nn.Module:
        # The model is complete before training: JointTraining adapts every dynamic module to every
        # experience, which would give the ExpertViT one more expert per experience.
        return (self.model if model is None else model).to(self.device)

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # Avalanche's: the model adapts (to nothing, see model_adaptation), then the optimiser's schedule restarts.
        self.model = self.model_adaptation()
        self.make_optimizer(**kwargs)

    def make_optimizer(self, **kwargs: Any) -> None:
        self.restart_cosine()
