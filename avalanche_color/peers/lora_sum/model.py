"""One shared ViT adapted by a sum of LoRA components, and one classifier over every class seen.

The model of SD-LoRA and InfLoRA (:class:`LoRASumViT`; each method subclasses it). Unlike
CoLoR's routed experts, nothing is routed: every sample runs one forward through the
backbone with all components summed (:mod:`~avalanche_color.peers.lora_sum.layer`), then
the one linear head. The head grows with the classes of each training experience (new rows
as ``nn.Linear`` initialises them; old rows kept); classes never trained get ``-inf``.

The learned state (components, method parameters, head, class masks) is the model's
:meth:`experts_state_dict`, without the frozen backbone, so the package's checkpoint and
resume (:func:`~avalanche_color.train_stream`) and :meth:`save_pretrained` keep only that.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Optional, TypeVar

import torch
from avalanche.models import DynamicModule
from torch import Tensor, nn

from avalanche_color.config import Options
from avalanche_color.experts.routed_vit import (backbone_images, check_classes, check_experience_images,
                                                check_vision_transformer)
from avalanche_color.lora import expert_tokens, trained_dtype
from avalanche_color.peers.lora_sum.files import load_folder, save_folder
from avalanche_color.peers.lora_sum.layer import LoRASumQKV, Mixing, Part
from avalanche_color.peers.lora_sum.learned_state import learned_state, load_learned_state
from avalanche_color.utils.files import PathLike
from avalanche_color.utils.state import host_value, keep_host_value
from avalanche_color.utils.rng import seeded
from avalanche_color.utils.experiences import experience_classes

Model = TypeVar("Model", bound="LoRASumViT")


class LoRASumViT(DynamicModule):
    """A frozen timm ViT whose every block's qkv carries a sum of LoRA components, and a growing head.

    Subclasses set :attr:`parts` and implement :meth:`mixing` and :meth:`start_component`
    (what a new experience adds besides each layer's component).

    Args:
        vit: a timm ``VisionTransformer``; the model adapts a copy, the given one is unchanged.
        config: the method's options (its ``expert_setting`` fields decide what saved weights mean).
    """

    parts: ClassVar[tuple[Part, Part]]
    config_class: ClassVar[type[Options]]
    finished: Tensor
    trained_classes: Tensor
    current_classes: Tensor

    def __init__(self, vit: nn.Module, config: Any) -> None:
        super().__init__()
        check_vision_transformer(vit)
        self.config = config
        self.backbone = copy.deepcopy(vit).requires_grad_(False).eval()
        for block in self.backbone.blocks:
            block.attn.qkv = LoRASumQKV(block.attn.qkv, self.parts)
        weight = self.backbone.patch_embed.proj.weight
        width = int(self.backbone.num_features)
        # The head is float32 beside a bfloat16 backbone (lora.dtypes; features are cast up to it, so the
        # logits are float32), in the backbone's dtype beside a float64 one; it grows with the classes.
        head_dtype = trained_dtype(weight.dtype)
        self.head_weight = nn.Parameter(weight.new_empty(0, width, dtype=head_dtype))
        self.head_bias = nn.Parameter(weight.new_empty(0, dtype=head_dtype))
        self.register_buffer("finished", torch.zeros(0, dtype=torch.bool, device=weight.device))
        self.register_buffer("trained_classes", torch.zeros(0, dtype=torch.bool, device=weight.device))
        self.register_buffer("current_classes", torch.zeros(0, dtype=torch.bool, device=weight.device))
        self.max_class_label = 0  # one past the largest class id of any adapted experience

    # ------------------------------------------------------------------ structure

    @property
    def layers(self) -> list[LoRASumQKV]:
        return [block.attn.qkv for block in self.backbone.blocks]

    @property
    def num_experts(self) -> int:
        """Components so far, one per training experience (the name the checkpoint plugin reads)."""
        return len(self.finished)

    @property
    def num_classes(self) -> int:
        return max(self.head_weight.shape[0], self.max_class_label)

    @property
    def device(self) -> torch.device:
        return self.head_weight.device

    def mixing(self) -> Mixing:
        """The coefficients of the components in this forward."""
        raise NotImplementedError

    def start_component(self, rank: int) -> None:
        """Add a component of ``rank`` to every layer, plus what the method keeps per component."""
        for layer in self.layers:
            layer.add_component(rank)
        self.finished = torch.cat((self.finished, self.finished.new_zeros(1)))

    def finish_component(self) -> None:
        """The current component is learned: from now on it is frozen."""
        if len(self.finished):
            self.finished[-1] = True
        self.set_trainable()

    def training_component(self) -> Optional[int]:
        """The component being learned: the newest, until :meth:`finish_component`; None after."""
        finished = self.finished_components()
        return len(finished) - 1 if finished and not finished[-1] else None

    def finished_components(self) -> list[bool]:
        """Per component, whether it is finished: ``finished`` as Python bools, read on the host once per
        change (every forward asks; a read per forward would be a host sync on a GPU)."""
        return host_value(self, "finished", self.finished, lambda finished: [bool(f) for f in finished.tolist()])

    def any_trained(self) -> bool:
        """Whether any class has been trained (read on the host once per change of ``trained_classes``)."""
        return host_value(self, "trained", self.trained_classes, lambda trained: bool(trained.any()))

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """What trains in the current experience: the head, and what the method adds (subclasses extend).
        Declared here, never read back from ``requires_grad``: the optimiser and DDP take these."""
        yield self.head_weight
        yield self.head_bias

    def component_parameter_count(self, component: int) -> int:
        """The parameters that learn with ``component`` and belong to it (subclasses say which)."""
        raise NotImplementedError

    def experience_parameter_count(self, component: int, num_classes: int) -> int:
        """What the experience of ``component`` trains when it brings ``num_classes`` classes: the
        component's own parameters, what the method trains beside it, and the head's new rows.
        The runner reports it for the first experience, as the papers count."""
        return self.component_parameter_count(component) + (int(self.backbone.num_features) + 1) * num_classes

    def set_trainable(self) -> None:
        """The one place that sets ``requires_grad``: on :meth:`trainable_parameters`, off everywhere else,
        where stale gradients are dropped (a finished component would otherwise hold its last ones)."""
        trainable = {id(parameter) for parameter in self.trainable_parameters()}
        for parameter in self.parameters():
            parameter.requires_grad_(id(parameter) in trainable)
            if id(parameter) not in trainable:
                parameter.grad = None

    # ------------------------------------------------------------------ classes

    def adaptation(self, experience: Any) -> None:
        """Avalanche's hook before each experience: in training, a new component (unless the last one
        is unfinished: a resumed or continued experience) and the experience's classes in the head."""
        super().adaptation(experience)
        classes = experience_classes(experience)
        if classes:
            self.max_class_label = max(self.max_class_label, max(classes) + 1)
        if not self.training or not classes:
            return
        check_classes(classes)
        check_experience_images(self.backbone, experience)
        self.learn_classes(classes)

    def learn_classes(self, classes: list[int]) -> None:
        """Start learning ``classes``: head rows for new ones, and a new component unless the last one is
        unfinished (a resumed run, or a further chunk of an online experience)."""
        # New weights drawn apart from the data's randomness: the same in every process, and in a resumed run.
        with seeded(int(self.config.init_seed) * 1_000_003 + self.num_experts):
            self.grow_head(max(classes) + 1)
            if not len(self.finished) or bool(self.finished[-1]):
                self.start_component(self.next_rank())
        self.current_classes = torch.zeros_like(self.trained_classes)
        self.current_classes[classes] = True
        self.trained_classes = self.trained_classes | self.current_classes
        keep_host_value(self, "trained", self.trained_classes, True)  # classes is not empty: no read needed
        self.set_trainable()

    def next_rank(self) -> int:
        return int(self.config.rank)

    def new_head_rows(self, width: int, count: int) -> nn.Linear:
        """The head's rows for ``count`` new classes, initialised as the method's code does (here:
        ``nn.Linear``'s default, InfLoRA's classifier; subclasses override)."""
        return nn.Linear(width, count)

    def grow_head(self, num_classes: int) -> None:
        """Head rows for class ids up to ``num_classes`` (new ones as :meth:`new_head_rows` makes them; old rows kept)."""
        extra = num_classes - self.head_weight.shape[0]
        if extra <= 0:
            return
        fresh = self.new_head_rows(self.head_weight.shape[1], extra)
        fresh = fresh.to(self.device, self.head_weight.dtype)
        self.head_weight = nn.Parameter(torch.cat((self.head_weight.detach(), fresh.weight.detach())))
        self.head_bias = nn.Parameter(torch.cat((self.head_bias.detach(), fresh.bias.detach())))
        grown = self.trained_classes.new_zeros(num_classes)
        grown[: len(self.trained_classes)] = self.trained_classes
        self.trained_classes, self.current_classes = grown, torch.zeros_like(grown)

    # ------------------------------------------------------------------ forward

    def features(self, x: Tensor) -> Tensor:
        """The pooled feature with every component summed in (one backbone forward)."""
        # The package's timm forward with an argument for every qkv layer (it hands ``mixing`` on as is).
        tokens = expert_tokens(self.backbone, backbone_images(self.backbone, x),
                               self.mixing())  # type: ignore[arg-type]
        return self.backbone.forward_head(tokens, pre_logits=True)

    def forward(self, x: Tensor) -> Tensor:
        """Logits over every class id seen (``-inf`` for classes never trained)."""
        if not self.any_trained():  # Avalanche may evaluate before the first experience
            return x.new_zeros(x.shape[0], self.num_classes, dtype=self.head_weight.dtype)
        features = self.features(x).to(self.head_weight.dtype)  # a bfloat16 backbone's, up to the head's float32
        logits = nn.functional.linear(features, self.head_weight, self.head_bias)
        logits = logits.masked_fill(~self.trained_classes, float("-inf"))
        missing = self.num_classes - logits.shape[1]  # classes of adapted experiences never trained
        return nn.functional.pad(logits, (0, missing), value=float("-inf")) if missing else logits

    def train(self, mode: bool = True) -> "LoRASumViT":
        super().train(mode)
        self.backbone.eval()  # the frozen ViT never sees dropout or drop-path noise (as InfLoRA's code)
        return self

    # ------------------------------------------------------------------ state

    def experts_state_dict(self) -> dict[str, Tensor]:
        """Everything learned (components, method parameters, head, class masks), no backbone weight."""
        return learned_state(self)

    def save_pretrained(self, folder: PathLike) -> Path:
        """Write the learned state (no backbone) and ``config.json`` into ``folder``, atomically."""
        return save_folder(self, folder)

    @classmethod
    def from_pretrained(cls: type[Model], folder: PathLike, backbone: nn.Module) -> Model:
        """The model saved in ``folder`` on a copy of ``backbone`` (the ViT it was trained on), in eval mode."""
        return load_folder(cls, folder, backbone)

    def load_experts_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load :meth:`experts_state_dict` into this model, growing its structure to fit first."""
        load_learned_state(self, state)
