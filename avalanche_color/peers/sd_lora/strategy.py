"""SD-LoRA as an Avalanche strategy (Wu et al., "SD-LoRA: Scalable Decoupled Low-Rank Adaptation for
Class Incremental Learning", ICLR 2025; code WuYichen-97/SD-Lora-CL).

The model and each choice with its source: :mod:`avalanche_color.peers.sd_lora.model`.
Training, from ``models/sdlora.py``: one classifier over every class seen (``IncrementalNet``'s
``fc`` grows, old rows kept); the loss of a later task is the cross-entropy over the logits of
its own classes only (``logits[:, known_classes:]``), so old-class logits are left out of
training and used at evaluation; what trains is the new direction, every magnitude and the
classifier; one forward per sample at inference, nothing routed.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional, Sequence, Union

import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import nn

from avalanche_color.config import Precision
from avalanche_color.peers.lora_sum.strategy import LoRASumTemplate
from avalanche_color.peers.sd_lora.config import (DirectionNorm, EarlierMagnitudes, HeadInit, NormaliseWhen, Optimizer,
                                                  Schedule, SDLoRAConfig)
from avalanche_color.peers.sd_lora.model import SDLoRAViT


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

    Args:
        model: a timm ``VisionTransformer`` (the strategy adapts a copy; the given ViT is unchanged),
            or an :class:`SDLoRAViT` to continue from: its expert settings then apply, and one
            given another value is refused.
        config: all options as one :class:`SDLoRAConfig`; options given beside it with a value other than
            their default replace its fields.
        rank: rank of each direction (paper and code: 10).
        rank_schedule: SD-LoRA-RR: the rank of each experience's direction, the last repeated for later
            ones (the code's: ``(10, 10, 10, 10, 8, 8, 8, 8, 6)``); None: ``rank`` throughout.
        magnitude_init: each new magnitude's start (code: 0.8).
        direction_norm: ``"factors"`` divides a frozen direction by ``||B||_F ||A||_F`` (code);
            ``"product"`` by ``||B A||_F`` (the paper's notation).
        normalise_when: ``"next_experience"``: the newest direction is normalised when the next
            experience starts, so the evaluation after an experience scores the network as trained
            (code); ``"finish"``: as soon as its experience ends, before that evaluation.
        earlier_magnitudes: ``"restart"``: every earlier magnitude restarts at ``magnitude_init`` when an
            experience starts (code: it rebuilds the network per task); ``"keep"``: they continue from
            their learned values.
        head_init: the classifier's new rows: ``"kaiming"``, Kaiming-uniform weights (gain 1) and zero bias
            (code: ``SimpleLinear``); ``"linear"``, ``nn.Linear``'s default.
        optimizer: ``"sgd"`` (with ``momentum``, the code's) or ``"adam"`` (betas 0.9, 0.999).
        lr: learning rate (code: 0.008 on CIFAR-100, 0.01 on ImageNet-R).
        momentum: SGD momentum.
        weight_decay: weight decay (code: none).
        lr_schedule: ``"constant"`` (code: MultiStepLR milestones past the last epoch), ``"cosine"``
            over each experience's steps, or ``"epoch_cosine"`` (InfLoRA's code's per-epoch cosine).
        train_mb_size: training mini-batch size (code: 128).
        train_epochs: epochs per experience (code: 20).
        eval_mb_size: evaluation mini-batch size.
        eval_every: Avalanche's periodic evaluation (-1: none).
        precision: ``"32-true"`` (float32); ``"bf16-mixed"`` or ``"16-mixed"``: each forward and its loss
            under bfloat16 or float16 autocast, the trained weights kept float32 (float16 with a gradient
            scaler; see :class:`~avalanche_color.training.strategy.MixedPrecision`). A ViT given in bfloat16 stays so (half its
            memory); the components, magnitudes and head are float32 beside it all the same.
        check_data: scan each training experience for bad samples before training on it.
        init_seed: seed of each new component's and head rows' random initialisation, drawn apart from
            the global generators: a run under torchrun, a resumed run and a single process draw the same.
        num_workers: DataLoader worker processes of every loader (0: in this process).
        pin_memory: page-locked batches; None: when the device is CUDA.
        persistent_workers: keep workers between epochs (needs ``num_workers`` >= 1).
        criterion: loss; a new ``CrossEntropyLoss`` by default.
        device: where the model trains.
        plugins: Avalanche plugins (replay, distillation, regularisation and LR scheduler plugins are
            refused with the reason).
        evaluator: Avalanche's evaluation plugin.
        **kwargs: Avalanche's other ``SupervisedTemplate`` keywords (``peval_mode``, ...).
    """

    model: SDLoRAViT
    config: SDLoRAConfig
    config_class: ClassVar[type[SDLoRAConfig]] = SDLoRAConfig
    model_class: ClassVar[type[SDLoRAViT]] = SDLoRAViT
    model_config_class: ClassVar[type[SDLoRAConfig]] = SDLoRAConfig

    def __init__(
        self,
        model: nn.Module,
        *,
        config: Optional[SDLoRAConfig] = None,
        rank: int = 10,
        rank_schedule: Optional[tuple[int, ...]] = None,
        magnitude_init: float = 0.8,
        direction_norm: DirectionNorm = "factors",
        normalise_when: NormaliseWhen = "next_experience",
        earlier_magnitudes: EarlierMagnitudes = "restart",
        head_init: HeadInit = "kaiming",
        optimizer: Optimizer = "sgd",
        lr: float = 8e-3,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        lr_schedule: Schedule = "constant",
        train_mb_size: int = 128,
        train_epochs: int = 20,
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
        # Every option above, by name: the fields of SDLoRAConfig (tests/test_signatures.py).
        options = {name: value for name, value in locals().items() if name in SDLoRAConfig.names()}
        options, kwargs = self.checked_options(model, config, options, plugins, kwargs)
        super().__init__(model=model, config=SDLoRAConfig.build(config, **options), criterion=criterion,
                         device=device, plugins=plugins, evaluator=evaluator, template_options=kwargs)
