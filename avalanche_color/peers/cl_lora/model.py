"""CL-LoRA's model: a frozen ViT with CL-LoRA's adapters (:class:`AdapterBank`), a cosine proxy head per
experience for training and class prototypes for evaluation (:class:`ExperienceHeads`), read top to bottom
from the qkv layer to :class:`CLLoRAViT`.

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

**The layer** (:class:`CLLoRAQKV`): a fused qkv layer with one LoRA update on q and v, chosen by the caller
per forward. The authors' ``Attention_lora`` adds ``w_q U_q D_q x`` to q and ``w_v U_v D_v x`` to v, where x
is the block's ``norm1`` output, D (r x d) the down and U (d x r) the up projection, no scaling, k untouched.
Unlike SD-LoRA and InfLoRA nothing is summed: each forward runs one adapter per block (the shared
one, its distillation teacher's, or one experience's task-specific one), so the layer holds no
adapter; the model passes it a :class:`QVUpdate`.

**The adapters** (:class:`AdapterBank`; ``backbone/vit_cllora.py`` of the authors' code) and the token paths
through them:

* Shared blocks (``general_pos``, the first ones): one :class:`QVAdapter` each for the whole stream, its
  D frozen from the start, its U trained in every experience and never reset, coefficient 1. The
  distillation teacher is a copy of the shared U's at the previous experience's end (its D's are the
  shared ones, which never change).
* Task-specific blocks (``specfic_pos``, the rest): per experience one new adapter each (D and U train,
  frozen after it) and block weights (3 x task-specific blocks, rows q, k, v, init U(0.5, 1.5)); row q
  scales q's update and row v v's, row k is unused in the forward (but in the orthogonality term).

**The heads** (:class:`ExperienceHeads`; ``utils/inc_net.py`` ``OurNet`` and ``backbone/linears.py`` of the
authors' code): the cosine proxy head each experience trains with (:func:`cosine_logits`), and the class
prototypes it leaves. One row per (class, experience): its class, its experience and its prototype (zeros
until the experience ends). On a class-incremental stream that is one row per class, the code's diagonal
blocks of ``fc``; a class that returns in a later experience (a domain stream) gets another row.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Optional, TypeVar

import torch
from avalanche.models import DynamicModule
from torch import Tensor, nn
from torch.nn import functional as F

from avalanche_color.experts.routed_vit import (backbone_images, check_classes, check_experience_images,
                                                check_vision_transformer)
from avalanche_color.lora import block_forward, fused_qkv_width, trained_dtype
from avalanche_color.peers.cl_lora.config import CLLoRAConfig
from avalanche_color.peers.lora_sum.model import load_folder, save_folder
from avalanche_color.utils.experiences import experience_classes, origin_experience
from avalanche_color.utils.files import PathLike
from avalanche_color.utils.state import host_value, keep_host_value, take_stored_shapes, train_only


@dataclass(frozen=True)
class QVUpdate:
    """The update of one forward: index 0 is q, index 1 is v.

    Attributes:
        down: (2, r, d), D.
        up: (2, d, r), U.
        weights: (2,), the block weights of q and v (a task-specific block); None: 1 (a shared block).
    """

    down: Tensor
    up: Tensor
    weights: Optional[Tensor] = None


def orthonormal_down(width: int, rank: int, generator: torch.Generator) -> Tensor:
    """(rank, width) ``Qᵀ`` of the reduced QR of a uniform [0, 1) (width x rank) matrix (the code's
    ``Adapter_lora`` init; rows orthonormal, not Haar-distributed). Drawn in float32, the QR in float64."""
    q, _ = torch.linalg.qr(torch.rand(width, rank, generator=generator).double())
    return q.T.contiguous()


class QVAdapter(nn.Module):
    """One block's LoRA on q and v: ``down`` (2, r, d) orthonormal rows per part, ``up`` (2, d, r) zeros
    (a new adapter changes nothing). The generator draws q's D, then v's."""

    def __init__(self, width: int, rank: int, generator: torch.Generator, like: Tensor) -> None:
        super().__init__()
        down = torch.stack([orthonormal_down(width, rank, generator) for _ in range(2)])
        self.down = nn.Parameter(down.to(like.device, like.dtype))
        self.up = nn.Parameter(like.new_zeros(2, width, rank))


class CLLoRAQKV(nn.Module):
    """One timm ``attn.qkv`` (kept frozen as ``base_layer``) plus the update it is given.

    Args:
        base_layer: the fused ``nn.Linear`` whose output is ``[q | k | v]``.
    """

    def __init__(self, base_layer: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.width = fused_qkv_width(base_layer)

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    def forward(self, x: Tensor, update: Optional[QVUpdate] = None) -> Tensor:
        """``[q + w_q U_q D_q x | k | v + w_v U_v D_v x]``; ``[q | k | v]`` without an update."""
        out = self.base_layer(x)
        if update is None:
            return out
        q, k, v = out.split(self.width, dim=-1)
        # The float32 factors computed in the tokens' dtype (a bfloat16 ViT's), as autocast casts a weight.
        low = [(x @ update.down[i].T.to(x.dtype)) @ update.up[i].T.to(x.dtype) for i in range(2)]
        if update.weights is not None:
            low = [update.weights[i].to(x.dtype) * low[i] for i in range(2)]
        return torch.cat((q + low[0], k, v + low[1]), dim=-1)


class AdapterBank(nn.Module):
    """The shared adapters, their teacher, and each experience's task-specific adapters and block weights.

    Args:
        num_blocks, num_shared: the ViT's blocks and how many first ones are shared.
        width, rank: the qkv layers' input width and the adapters' rank.
        generator: draws the shared adapters' D's (block by block, q then v).
        like: a tensor of the trained weights' dtype (float32 beside a bfloat16 ViT) and the backbone's device.
    """

    teacher_up: Tensor

    def __init__(self, num_blocks: int, num_shared: int, width: int, rank: int, generator: torch.Generator,
                 like: Tensor) -> None:
        super().__init__()
        self.num_shared, self.num_specific, self.width, self.rank = num_shared, num_blocks - num_shared, width, rank
        self.shared = nn.ModuleList(QVAdapter(width, rank, generator, like) for _ in range(num_shared))
        self.register_buffer("teacher_up", like.new_zeros(num_shared, 2, width, rank))
        self.specific = nn.ModuleList()  # per experience: a ModuleList of one QVAdapter per task-specific block
        self.block_weights = nn.ParameterList()  # per experience: (3, task-specific blocks)

    def add_experience(self, generator: torch.Generator, like: Tensor) -> None:
        """New task-specific adapters (block by block, q then v), then block weights U(0.5, 1.5)."""
        self.specific.append(nn.ModuleList(QVAdapter(self.width, self.rank, generator, like)
                                           for _ in range(self.num_specific)))
        weights = torch.rand(3, self.num_specific, generator=generator, dtype=torch.float64) + 0.5
        self.block_weights.append(nn.Parameter(weights.to(like.device, like.dtype)))

    @torch.no_grad()
    def snapshot_teacher(self) -> None:
        """The shared U's as they are now become the distillation teacher."""
        if self.num_shared:
            self.teacher_up.copy_(torch.stack([adapter.up for adapter in self.shared]))

    def shared_tokens(self, blocks: nn.Sequential, tokens: Tensor, teacher: bool = False) -> Tensor:
        """Through the shared blocks with the shared adapters (``teacher``: the teacher's U's instead)."""
        for index, adapter in enumerate(self.shared):
            up = self.teacher_up[index] if teacher else adapter.up
            tokens = block_forward(blocks[index], tokens, QVUpdate(adapter.down, up))
        return tokens

    def specific_tokens(self, blocks: nn.Sequential, tokens: Tensor, experience: int) -> Tensor:
        """Through the task-specific blocks with ``experience``'s adapters and its q and v block weights."""
        weights = self.block_weights[experience]
        for j, adapter in enumerate(self.specific[experience]):
            update = QVUpdate(adapter.down, adapter.up, weights[0::2, j])
            tokens = block_forward(blocks[self.num_shared + j], tokens, update)
        return tokens


def cosine_logits(features: Tensor, weight: Tensor, sigma: Tensor) -> Tensor:
    """``σ cos(f, w_c)`` per class c (``CosineLinearFeature``; ``F.normalize``'s eps 1e-12 on both), in the
    weight's dtype (a bfloat16 ViT's features are lifted to the float32 proxy)."""
    return sigma * (F.normalize(features.to(weight.dtype), dim=1) @ F.normalize(weight, dim=1).T)


class ExperienceHeads(nn.Module):
    """Per experience: a proxy head ``σ cos(f, w_c)`` over its classes, its prototypes, whether it is finished.

    Args:
        features: the width of the features.
        like: a tensor of the trained weights' dtype (float32 beside a bfloat16 ViT) and the backbone's device.
    """

    finished: Tensor
    row_classes: Tensor
    row_experience: Tensor
    prototypes: Tensor
    ROWS = ("finished", "row_classes", "row_experience", "prototypes")  # buffers that grow with the stream

    def __init__(self, features: int, like: Tensor) -> None:
        super().__init__()
        self.proxy_weights = nn.ParameterList()  # per experience: (its classes, features)
        self.proxy_sigmas = nn.ParameterList()  # per experience: (1,), σ
        self.register_buffer("finished", torch.zeros(0, dtype=torch.bool, device=like.device))
        self.register_buffer("row_classes", torch.zeros(0, dtype=torch.long, device=like.device))
        self.register_buffer("row_experience", torch.zeros(0, dtype=torch.long, device=like.device))
        self.register_buffer("prototypes", like.new_zeros(0, features))

    def add_experience(self, classes: list[int], generator: torch.Generator) -> None:
        """A proxy head over ``classes`` (w uniform in ±1/√features, σ = 1) and their prototype rows."""
        like, e = self.prototypes, len(self.finished)
        bound = 1 / like.shape[1] ** 0.5
        weight = (torch.rand(len(classes), like.shape[1], generator=generator, dtype=torch.float64) * 2 - 1) * bound
        self.proxy_weights.append(nn.Parameter(weight.to(like.device, like.dtype)))
        self.proxy_sigmas.append(nn.Parameter(like.new_ones(1)))
        # The new rows are known on the host: kept beside the grown buffers, so that the experience's
        # first training step reads none of them back from the device.
        finished = self.finished_experiences() + [False]
        row_classes = host_value(self, "classes", self.row_classes, lambda t: t.tolist()) + list(classes)
        row_experience = host_value(self, "rows", self.row_experience, lambda t: t.tolist()) + [e] * len(classes)
        self.finished = torch.cat((self.finished, self.finished.new_zeros(1)))
        self.row_classes = torch.cat((self.row_classes, torch.tensor(classes, device=like.device)))
        self.row_experience = torch.cat((self.row_experience, self.row_experience.new_full((len(classes),), e)))
        self.prototypes = torch.cat((self.prototypes, like.new_zeros(len(classes), like.shape[1])))
        keep_host_value(self, "finished", self.finished, finished)
        keep_host_value(self, "classes", self.row_classes, row_classes)
        keep_host_value(self, "rows", self.row_experience, row_experience)

    def finished_experiences(self) -> list[bool]:
        """Per experience, whether it is finished (read on the host once per change)."""
        return host_value(self, "finished", self.finished, lambda t: [bool(f) for f in t.tolist()])

    def training_experience(self) -> Optional[int]:
        """The experience being learned: the newest, until :meth:`finish`; None after."""
        finished = self.finished_experiences()
        return len(finished) - 1 if finished and not finished[-1] else None

    def rows(self, experience: int) -> list[int]:
        experiences = host_value(self, "rows", self.row_experience, lambda t: t.tolist())
        return [i for i, e in enumerate(experiences) if e == experience]

    def class_ids(self, experience: int) -> list[int]:
        """``experience``'s classes, in the order of its proxy head's and prototypes' rows."""
        classes = host_value(self, "classes", self.row_classes, lambda t: t.tolist())
        return [classes[i] for i in self.rows(experience)]

    def proxy_logits(self, features: Tensor, experience: int) -> Tensor:
        return cosine_logits(features, self.proxy_weights[experience], self.proxy_sigmas[experience])

    def prototype_logits(self, features: dict[int, Tensor], num_classes: int) -> Tensor:
        """(batch, ``num_classes``): per class, its best ``cos(f_e, proto)`` over the experiences e of ``features``
        (experience -> the feature of its network) that trained it; ``-inf`` for the other classes."""
        scores = None
        for e, f in features.items():
            cos = F.normalize(f.to(self.prototypes.dtype), dim=1) @ F.normalize(self.prototypes[self.rows(e)], dim=1).T
            if scores is None:
                scores = cos.new_full((cos.shape[0], num_classes), float("-inf"))
            classes = self.class_ids(e)
            scores[:, classes] = torch.maximum(scores[:, classes], cos)
        if scores is None:
            raise ValueError("prototype_logits needs the features of at least one experience, got none")
        return scores

    @torch.no_grad()
    def set_prototypes(self, experience: int, prototypes: Tensor) -> None:
        self.prototypes[self.rows(experience)] = prototypes.to(self.prototypes.dtype)

    @torch.no_grad()
    def finish(self) -> None:
        if len(self.finished):
            self.finished[-1] = True


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

    def experience_parameter_count(self, experience: int, num_classes: Optional[int]) -> int:
        """What ``experience`` trains with ``num_classes`` classes: the shared U's, its task-specific D's and U's,
        block weights and proxy head (the authors' log, "Trainable params", counts the backbone's: no head)."""
        if num_classes is None:
            raise ValueError(f"num_classes is needed to count what an experience of {type(self).__name__} trains "
                             f"(its proxy head rows are its classes'), got None")
        bank, features = self.adapters, self.experiences.prototypes.shape[1]
        shared = sum(adapter.up.numel() for adapter in bank.shared)
        specific = sum(p.numel() for p in bank.specific[experience].parameters())
        specific += bank.block_weights[experience].numel()
        return shared + specific + num_classes * features + 1

    def set_trainable(self) -> None:
        """The one place that sets ``requires_grad``: on :meth:`trainable_parameters`, off everywhere else."""
        train_only(self, self.trainable_parameters())

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
