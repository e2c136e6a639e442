"""InfLoRA as an Avalanche strategy (Liang & Li, "InfLoRA: Interference-Free Low-Rank Adaptation for
Continual Learning", CVPR 2024; code liangyanshuo/InfLoRA).

The model and each choice with its source, its protected subspaces included:
:mod:`avalanche_color.peers.inf_lora.model`. Training, from ``methods/inflora.py``: before
the task, one pass over its training data (the training loader, no gradients) measures each
layer's inputs and designs ``A_t``; the task trains ``B_t`` and the classifier with the
cross-entropy over its own classes' logits (the code's current ``classifier_pool`` entry
against ``targets - known_classes``); after it, a second pass with the trained branch updates
the protected subspaces. Evaluation uses one classifier over all classes seen (the code's
``interface`` concatenates every task's classifier), one forward per sample, nothing routed.
Our choices: the passes run over the experience's whole training data on every rank under
torchrun (identical subspaces everywhere, no reduction needed), and leave the random
generators as they were.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional, Sequence, Union

import torch
from avalanche.benchmarks.utils.data_loader import collate_from_data_or_kwargs
from avalanche.core import BasePlugin
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from torch import Tensor, nn

from avalanche_color.config import Precision
from avalanche_color.peers.inf_lora.config import InfLoRAConfig, Optimizer, Schedule
from avalanche_color.peers.inf_lora.model import InfLoRAViT
from avalanche_color.peers.lora_sum.model import input_covariances
from avalanche_color.peers.lora_sum.strategy import LoRASumTemplate
from avalanche_color.training.loaders import data_loader, loader_options
from avalanche_color.utils.experiences import origin_experience
from avalanche_color.utils.rng import generators_untouched


class InfLoRA(LoRASumTemplate):
    """InfLoRA on any timm ViT: each experience's LoRA trains only outside its predecessors' inputs.

    ``W = W0 + sum_t B_t A_t`` on the key and value projections of every block. Before experience
    t, ``A_t`` is set to the top directions of its inputs outside the subspace protected for
    earlier experiences and fixed; only ``B_t`` (and the classifier) trains, so the layer's output
    on protected inputs does not change. Defaults: the official code's Split CIFAR-100 run.

    Args:
        model: a timm ``VisionTransformer`` (the strategy adapts a copy; the given ViT is unchanged),
            or an :class:`InfLoRAViT` to continue from: its expert settings then apply, and one
            given another value is refused.
        config: all options as one :class:`InfLoRAConfig`; options given beside it with a value other than
            their default replace its fields.
        rank: rank of each experience's branch (code: 10 on CIFAR-100 and ImageNet-R, 30 on DomainNet).
        threshold: epsilon, the fraction of an experience's input energy the protected subspace keeps
            (code: 0.95 on CIFAR-100, 0.98 on ImageNet-R).
        final_threshold: epsilon reached at the last experience when ``num_experiences`` is given (code: 1.0).
        num_experiences: the stream's length T: epsilon_t rises from ``threshold`` to ``final_threshold``
            as ``threshold + (final_threshold - threshold) t / T`` (the code's ``lamb``, ``lame``); None
            keeps ``threshold``.
        optimizer: ``"adam"`` (betas 0.9, 0.999, the code's) or ``"sgd"`` (with ``momentum``).
        lr: learning rate (code: 5e-4).
        momentum: SGD momentum.
        weight_decay: weight decay (code: none).
        lr_schedule: ``"cosine"`` over each experience's steps to 0; ``"epoch_cosine"``, the code's per-epoch
            cosine as it runs, one epoch late (9.7% of lr in the last of 20 epochs; the fidelity page
            measures the difference); or ``"constant"``.
        train_mb_size: training mini-batch size (code: 128).
        train_epochs: epochs per experience (code: 20 on CIFAR-100, 50 on ImageNet-R).
        eval_mb_size: evaluation mini-batch size, also of the input passes.
        eval_every: Avalanche's periodic evaluation (-1: none).
        precision: ``"32-true"`` (float32); ``"bf16-mixed"`` or ``"16-mixed"``: each forward and its loss
            under bfloat16 or float16 autocast, the trained weights kept float32 (float16 with a gradient
            scaler; see :class:`~avalanche_color.training.strategy.MixedPrecision`). A ViT given in bfloat16 stays so (half its
            memory); the branches and head are float32 beside it all the same.
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

    model: InfLoRAViT
    config: InfLoRAConfig
    config_class: ClassVar[type[InfLoRAConfig]] = InfLoRAConfig
    model_class: ClassVar[type[InfLoRAViT]] = InfLoRAViT
    model_config_class: ClassVar[type[InfLoRAConfig]] = InfLoRAConfig

    def __init__(
        self,
        model: nn.Module,
        *,
        config: Optional[InfLoRAConfig] = None,
        rank: int = 10,
        threshold: float = 0.95,
        final_threshold: float = 1.0,
        num_experiences: Optional[int] = None,
        optimizer: Optimizer = "adam",
        lr: float = 5e-4,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        lr_schedule: Schedule = "cosine",
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
        # Every option above, by name: the fields of InfLoRAConfig (tests/test_signatures.py).
        options = {name: value for name, value in locals().items() if name in InfLoRAConfig.names()}
        options, kwargs = self.checked_options(model, config, options, plugins, kwargs)
        super().__init__(model=model, config=InfLoRAConfig.build(config, **options), criterion=criterion,
                         device=device, plugins=plugins, evaluator=evaluator, template_options=kwargs)

    def prepare_experience(self, **kwargs: Any) -> None:
        """Design the new branch's ``A_t`` from the experience's inputs outside the protected subspaces."""
        covariances = self.experience_covariances(**kwargs)
        bad = [index for index, covariance in enumerate(covariances) if not bool(torch.isfinite(covariance).all())]
        if bad:
            raise FloatingPointError(
                f"the inputs of the adapted layers {bad[:6]} became non-finite over experience "
                f"{self.experience.current_experience}'s training data, while designing its A_t (before iteration "
                f"0); stopped before any training step. Likely cause: pixels too large for the backbone "
                f"(normalise the images) or bad data")
        self.model.design_component(covariances)

    def conclude_component(self, **kwargs: Any) -> None:
        """Protect the experience's inputs, measured with its trained branch."""
        self.model.protect(self.experience_covariances(**kwargs))

    @torch.no_grad()
    def experience_covariances(self, **kwargs: Any) -> list[Tensor]:
        """Each LoRA'd layer's input representation over the experience's training data."""
        dataset = origin_experience(self.experience).dataset.train()  # an online chunk's whole experience
        collate: dict[str, Any] = {}
        collate_from_data_or_kwargs(dataset, collate)
        loader = data_loader(dataset, loader_options(kwargs, self.config), self.device,
                             batch_size=self.eval_mb_size, **collate)
        was_training = self.model.training
        self.model.eval()
        try:
            with generators_untouched(), input_covariances(self.model.layers) as sums:
                for batch in loader:
                    self.model.features(batch[0].to(self.device))
        finally:
            self.model.train(was_training)
        return [total.mean() for total in sums]
