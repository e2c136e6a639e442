"""SD-LoRA as an Avalanche strategy (Wu et al., "SD-LoRA: Scalable Decoupled Low-Rank Adaptation for
Class Incremental Learning", ICLR 2025; code WuYichen-97/SD-Lora-CL).

The model and each choice with its source: :mod:`avalanche_color.peers.sd_lora.model`.
Training, from ``models/sdlora.py``: one classifier over every class seen (``IncrementalNet``'s
``fc`` grows, old rows kept); the loss of a later task is the cross-entropy over the logits of
its own classes only (``logits[:, known_classes:]``), so old-class logits are left out of
training and used at evaluation; what trains is the new direction, every magnitude and the
classifier; one forward per sample at inference, nothing routed.
"""

from collections.abc import Sequence
from typing import Any, ClassVar, Optional, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import nn

from avalanche_color.config import Precision
from avalanche_color.peers.lora_sum.config import Optimizer, Schedule
from avalanche_color.peers.lora_sum.strategy import LoRASumTemplate
from avalanche_color.peers.sd_lora.config import DirectionNorm, EarlierMagnitudes, HeadInit, NormaliseWhen, SDLoRAConfig
from avalanche_color.peers.sd_lora.model import SDLoRAViT
from avalanche_color.training.strategy import Evaluator


class SDLoRA(LoRASumTemplate):
    """SD-LoRA on any timm ViT: frozen LoRA directions, magnitudes that keep learning, one classifier.

    In experience t, and at the evaluation after it,
    ``W = W0 + sum_{i<t} alpha_i B_i A_i / (||B_i||_F ||A_i||_F) + alpha_t B_t A_t`` on the query and
    value projections of every block, as the authors' code computes. Each training experience adds
    a direction (rank ``rank``) learned with its magnitude; once the experience ends the direction
    is frozen (bit-identical from then on), and it is normalised when the next experience starts,
    when every magnitude restarts at ``magnitude_init`` and learns again. Defaults: the official
    code's Split CIFAR-100 run; the paper's reading is ``direction_norm="product",
    normalise_when="finish", earlier_magnitudes="keep"``.
    """

    model: SDLoRAViT
    config: SDLoRAConfig
    config_class: ClassVar[type[SDLoRAConfig]] = SDLoRAConfig
    model_class: ClassVar[type[SDLoRAViT]] = SDLoRAViT
    model_config_class: ClassVar[type[SDLoRAConfig]] = SDLoRAConfig

    def __init__(
        self,
        model: nn.Module,
        config: Optional[SDLoRAConfig] = None,
        *,
        rank: int = SDLoRAConfig.rank,
        rank_schedule: Optional[tuple[int, ...]] = SDLoRAConfig.rank_schedule,
        magnitude_init: float = SDLoRAConfig.magnitude_init,
        direction_norm: DirectionNorm = SDLoRAConfig.direction_norm,
        normalise_when: NormaliseWhen = SDLoRAConfig.normalise_when,
        earlier_magnitudes: EarlierMagnitudes = SDLoRAConfig.earlier_magnitudes,
        head_init: HeadInit = SDLoRAConfig.head_init,
        lr: float = SDLoRAConfig.lr,
        # LoRASumTraining
        optimizer: Optimizer = SDLoRAConfig.optimizer,
        momentum: float = SDLoRAConfig.momentum,
        weight_decay: float = SDLoRAConfig.weight_decay,
        lr_schedule: Schedule = SDLoRAConfig.lr_schedule,
        train_epochs: int = SDLoRAConfig.train_epochs,
        init_seed: int = SDLoRAConfig.init_seed,
        # TrainingOptions
        train_mb_size: int = SDLoRAConfig.train_mb_size,
        eval_mb_size: int = SDLoRAConfig.eval_mb_size,
        eval_every: int = SDLoRAConfig.eval_every,
        check_data: bool = SDLoRAConfig.check_data,
        # PrecisionOptions
        precision: Precision = SDLoRAConfig.precision,
        # LoaderOptions
        num_workers: int = SDLoRAConfig.num_workers,
        pin_memory: Optional[bool] = SDLoRAConfig.pin_memory,
        persistent_workers: bool = SDLoRAConfig.persistent_workers,
        # Avalanche's (StrategyBase)
        criterion: Optional[nn.Module] = None,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Evaluator = default_evaluator,
        **template_options: Any,
    ) -> None:
        """SD-LoRA on ``model``, with the options of ``config`` and those given here (the others: their
        defaults).

        Each option (``rank`` to ``persistent_workers``) is a field of
        :class:`~avalanche_color.peers.sd_lora.config.SDLoRAConfig`, documented there; its default is the config's.
        ``criterion``, ``device``, ``plugins``, ``evaluator`` and Avalanche's other keywords: as
        :class:`~avalanche_color.training.strategy.StrategyBase` says.

        Args:
            model: a timm ``VisionTransformer``, of which the strategy builds its
                :class:`~avalanche_color.peers.sd_lora.model.SDLoRAViT` on a copy (the ViT given stays as it was);
                or a :class:`~avalanche_color.peers.sd_lora.model.SDLoRAViT` (a strategy's ``model``) to continue
                from: its own settings (``rank``, ``rank_schedule``, ``direction_norm``, ``normalise_when``) then
                apply, and one given another value is refused.
            config: all options as one :class:`~avalanche_color.peers.sd_lora.config.SDLoRAConfig`; an option given
                here replaces its field.
        """
        options = dict(
            rank=rank, rank_schedule=rank_schedule, magnitude_init=magnitude_init, direction_norm=direction_norm,
            normalise_when=normalise_when, earlier_magnitudes=earlier_magnitudes, head_init=head_init, lr=lr,
            optimizer=optimizer, momentum=momentum, weight_decay=weight_decay, lr_schedule=lr_schedule,
            train_epochs=train_epochs, init_seed=init_seed, train_mb_size=train_mb_size, eval_mb_size=eval_mb_size,
            eval_every=eval_every, check_data=check_data, precision=precision, num_workers=num_workers,
            pin_memory=pin_memory, persistent_workers=persistent_workers)
        super().__init__(model=model, config=config, options=options, criterion=criterion, device=device,
                         plugins=plugins, evaluator=evaluator, template_options=template_options)
