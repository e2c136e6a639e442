"""CL-LoRA's model: a frozen ViT with CL-LoRA's adapters (:mod:`~avalanche_color.peers.cl_lora.adapters`), a
cosine proxy head per experience for training and class prototypes for evaluation
(:mod:`~avalanche_color.peers.cl_lora.heads`).

What comes from where (authors' code JiangpengHe/CL-LoRA at df4e74e, ``backbone/vit_cllora.py``,
``utils/inc_net.py`` ``OurNet``):

* Training forward (``forward_train``): the shared blocks with the shared adapters, the task-specific
  blocks with the current experience's, then its proxy head. The distillation's student is the
  feature after the shared blocks (``forward_general_cls``), taken from the same pass.
* Evaluation (``forward_test``, ``forward_diagonal``): per finished experience i, the feature of the
  network with the *current* shared adapters and experience i's task-specific ones; a class scores
  ``cos(f_i(x), proto_c)`` in the experience that trained it (σ = 1; on a domain stream its best
  experience). The shared blocks run once, then the task-specific ones per experience.
* Features are ``forward_head(norm(tokens), pre_logits=True)``: the code's CLS after the final norm on a
  ViT with token pooling (every ViT the code runs).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Optional, TypeVar

import torch
from avalanche.models import DynamicModule
from torch import Tensor, nn

from avalanche_color.experts.routed_vit import (backbone_images, check_classes, check_experience_images,
                                                check_vision_transformer)
from avalanche_color.lora import trained_dtype
from avalanche_color.peers.cl_lora.adapters import AdapterBank
from avalanche_color.peers.cl_lora.config import CLLoRAConfig
from avalanche_color.peers.cl_lora.heads import ExperienceHeads
from avalanche_color.peers.cl_lora.layer import CLLoRAQKV
from avalanche_color.peers.lora_sum.files import load_folder, save_folder
from avalanche_color.utils.experiences import experience_classes, origin_experience
from avalanche_color.utils.files import PathLike
from avalanche_color.utils.state import take_stored_shapes

Model = TypeVar("Model", bound="CLLoRAViT")
_BLOCK_WEIGHTS = re.compile(r"^adapters\.block_weights\.(\d+)$")


class TrainingOutputs(NamedTuple):
    """One training forward: the proxy logits over every class id (``-inf`` outside the experience) and
    the feature after the shared blocks (the distillation's student)."""

    logits: Tensor
    shared_features: Tensor


class CLLoRAViT(DynamicModule):
    """A frozen timm ViT with CL-LoRA's shared and task-specific adapters on q and v, and its heads.

    Args:
        vit: a timm ``VisionTransformer``; the model adapts a copy.
        config: :class:`~avalanche_color.peers.cl_lora.config.CLLoRAConfig` (the model reads ``rank``,
            ``shared_blocks`` and ``init_seed``).
    """

    config_class: ClassVar[type[CLLoRAConfig]] = CLLoRAConfig

    def __init__(self, vit: nn.Module, config: CLLoRAConfig) -> None:
        super().__init__()
        check_vision_transformer(vit)
        self.config = config
        self.backbone = copy.deepcopy(vit).requires_grad_(False).eval()
        self.num_shared = config.shared_count(len(self.backbone.blocks))
        for block in self.backbone.blocks:
            block.attn.qkv = CLLoRAQKV(block.attn.qkv)
        # Trained weights (adapters, block weights, proxies) and prototypes: float32 beside a bfloat16 ViT.
        weight = self.backbone.patch_embed.proj.weight
        like = weight.new_empty(0, dtype=trained_dtype(weight.dtype))
        self.adapters = AdapterBank(len(self.blocks), self.num_shared, self.blocks[0].attn.qkv.in_features,
                                    config.rank, self.generator(-1), like)
        # Not "heads": the data checks read model.heads as CoLoR's.
        self.experiences = ExperienceHeads(int(self.backbone.num_features), like)
        self.max_class_label = 0  # one past the largest class id of any adapted experience

    @property
    def blocks(self) -> nn.Sequential:
        return self.backbone.blocks

    @property
    def num_experts(self) -> int:
        """Experiences started (the name the checkpoint plugin reads)."""
        return len(self.experiences.finished)

    @property
    def device(self) -> torch.device:
        return self.experiences.prototypes.device

    def generator(self, experience: int) -> torch.Generator:
        """The draws of ``experience``'s new weights (-1: the shared adapters), apart from the global generators."""
        return torch.Generator().manual_seed(int(self.config.init_seed) * 1_000_003 + experience + 1)

    def training_experience(self) -> Optional[int]:
        return self.experiences.training_experience()

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """What trains in the current experience (nothing between experiences): every shared U, the new
        task-specific D's and U's, block weights and proxy head. The shared D's never train."""
        e = self.training_experience()
        if e is None:
            return
        yield from (adapter.up for adapter in self.adapters.shared)
        yield from self.adapters.specific[e].parameters()
        yield self.adapters.block_weights[e]
        yield self.experiences.proxy_weights[e]
        yield self.experiences.proxy_sigmas[e]

    def experience_parameter_count(self, experience: int, num_classes: int) -> int:
        """What ``experience`` trains with ``num_classes`` classes: the shared U's, its task-specific D's and U's,
        block weights and proxy head (the authors' log, "Trainable params", counts the backbone's: no head)."""
        bank, features = self.adapters, self.experiences.prototypes.shape[1]
        shared = sum(adapter.up.numel() for adapter in bank.shared)
        specific = sum(p.numel() for p in bank.specific[experience].parameters())
        specific += bank.block_weights[experience].numel()
        return shared + specific + num_classes * features + 1

    def set_trainable(self) -> None:
        """The one place that sets ``requires_grad``: on :meth:`trainable_parameters`, off elsewhere."""
        trainable = {id(p) for p in self.trainable_parameters()}
        for parameter in self.parameters():
            parameter.requires_grad_(id(parameter) in trainable)
            if id(parameter) not in trainable:
                parameter.grad = None

    # ------------------------------------------------------------------ experiences

    def adaptation(self, experience: Any) -> None:
        """Avalanche's hook before each experience: in training, a new experience's weights over its
        classes unless the last one is unfinished (a resumed run, a further chunk of an online experience)."""
        super().adaptation(experience)
        classes = experience_classes(origin_experience(experience))
        if classes:
            self.max_class_label = max(self.max_class_label, max(classes) + 1)
        if not self.training or not classes:
            return
        check_classes(classes)
        check_experience_images(self.backbone, experience)
        if not self.num_experts or self.experiences.finished_experiences()[-1]:
            self.start_experience(classes)
        self.set_trainable()

    def start_experience(self, classes: list[int]) -> None:
        """New task-specific adapters, block weights and a proxy head over ``classes`` (drawn in this order)."""
        generator = self.generator(self.num_experts)
        self.adapters.add_experience(generator, self.experiences.prototypes)
        self.experiences.add_experience(classes, generator)
        self.max_class_label = max(self.max_class_label, max(classes) + 1)

    def finish_experience(self) -> None:
        """Freeze the experience's weights; the shared U's become the next experience's teacher."""
        self.experiences.finish()
        self.adapters.snapshot_teacher()
        self.set_trainable()

    # ------------------------------------------------------------------ forward

    def tokens(self, x: Tensor) -> Tensor:
        vit = self.backbone
        return vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(backbone_images(vit, x)))))

    def pooled(self, tokens: Tensor) -> Tensor:
        return self.backbone.forward_head(self.backbone.norm(tokens), pre_logits=True)

    def experience_features(self, x: Tensor, experience: int) -> Tensor:
        """The feature of ``experience``'s network: the current shared adapters, its task-specific ones."""
        shared = self.adapters.shared_tokens(self.blocks, self.tokens(x))
        return self.pooled(self.adapters.specific_tokens(self.blocks, shared, experience))

    def teacher_features(self, x: Tensor) -> Tensor:
        """The distillation teacher's feature: the shared blocks with the teacher's U's, the final norm."""
        return self.pooled(self.adapters.shared_tokens(self.blocks, self.tokens(x), teacher=True))

    def training_outputs(self, x: Tensor) -> TrainingOutputs:
        """The training forward of the experience being learned (one pass; see :class:`TrainingOutputs`)."""
        e = self.training_experience()
        if e is None:
            raise RuntimeError("no experience is being learned: training_outputs runs between adaptation and "
                               "finish_experience")
        shared = self.adapters.shared_tokens(self.blocks, self.tokens(x))
        local = self.experiences.proxy_logits(self.pooled(self.adapters.specific_tokens(self.blocks, shared, e)), e)
        logits = local.new_full((local.shape[0], self.max_class_label), float("-inf"))
        logits[:, self.experiences.class_ids(e)] = local
        return TrainingOutputs(logits, self.pooled(shared))

    def forward(self, x: Tensor) -> Tensor:
        """Evaluation logits over every class id: a class's best ``cos(f_i(x), proto)`` over the finished
        experiences i that trained it; ``-inf`` for classes never trained."""
        finished = [e for e, done in enumerate(self.experiences.finished_experiences()) if done]
        if not finished:  # Avalanche may evaluate before the first experience ends
            return x.new_zeros(x.shape[0], self.max_class_label, dtype=self.experiences.prototypes.dtype)
        shared = self.adapters.shared_tokens(self.blocks, self.tokens(x))
        features = {e: self.pooled(self.adapters.specific_tokens(self.blocks, shared, e)) for e in finished}
        return self.experiences.prototype_logits(features, self.max_class_label)

    def train(self, mode: bool = True) -> "CLLoRAViT":
        super().train(mode)
        self.backbone.eval()  # the frozen ViT never sees dropout (the code's drop rates are 0)
        return self

    # ------------------------------------------------------------------ state

    def experts_state_dict(self) -> dict[str, Tensor]:
        """Everything learned or kept (adapters, teacher, block weights, proxies, prototypes), no backbone."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("backbone.")}

    def load_experts_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load :meth:`experts_state_dict` into this model, growing its experiences to fit first."""
        count = sum(1 for key in state if _BLOCK_WEIGHTS.match(key))
        classes, rows = state["experiences.row_classes"].tolist(), state["experiences.row_experience"].tolist()
        for e in range(self.num_experts, count):
            self.start_experience([c for c, r in zip(classes, rows) if r == e])
        take_stored_shapes(self.experiences, state, "experiences.", ExperienceHeads.ROWS)
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [key for key in missing if not key.startswith("backbone.")]
        if missing or unexpected:
            raise ValueError(f"the state does not fit this {type(self).__name__}: missing {missing}, "
                             f"unexpected {unexpected}")
        self.max_class_label = max([self.max_class_label, *(c + 1 for c in classes)])
        self.set_trainable()

    def save_pretrained(self, folder: PathLike) -> Path:
        """Write the learned state (no backbone) and ``config.json`` into ``folder``, atomically."""
        return save_folder(self, folder)

    @classmethod
    def from_pretrained(cls: type[Model], folder: PathLike, backbone: nn.Module) -> Model:
        """The model saved in ``folder`` on a copy of ``backbone`` (the ViT it was trained on), in eval mode."""
        return load_folder(cls, folder, backbone)
