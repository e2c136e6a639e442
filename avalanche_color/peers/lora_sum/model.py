"""The LoRA-sum family, one file top to bottom: one shared ViT adapted by a sum of LoRA components, and one
classifier over every class seen (SD-LoRA, InfLoRA and LoRA subtraction each subclass its model).

**The layer** (:class:`LoRASumQKV`): a fused qkv layer with a sum of LoRA components on two of its q, k, v
parts. Each method adapts one shared ViT for every experience: each experience adds a component (rank-r
``A`` and ``B`` per adapted part) and the layer computes

    qkv(x) = W0 x + sum_i c_i B_i A_i x   on the adapted parts (q and v, or k and v),

with a coefficient ``c_i`` per component given by the caller (:class:`Mixing`): SD-LoRA's
magnitude over the direction's norm, InfLoRA's 1, LoRA subtraction's 1 (or -1 in its subtracted
network). Each component's weights are a :class:`~avalanche_color.lora.QVLoRA` (A Kaiming-uniform,
B zeros, scaling 1): its index 0 belongs to the first adapted part, index 1 to the second.

Which components run low-rank is an argument (:attr:`Mixing.low_rank`: those whose factors train);
every other one is folded into the weight (one matmul, a d x r x d product per component and
forward, nothing per sample; gradients still reach its coefficient through the fold). Nothing is
read from ``requires_grad`` or the grad mode, so the same call computes the same way everywhere.

The components are float32 on a bfloat16 or float16 layer (:func:`~avalanche_color.lora.trained_dtype`), so that
SGD's small updates are kept; each forward casts their factors to the dtype they meet (the weight's when
folded, the tokens' when low-rank), as autocast casts a linear layer's weight: on a float32 or float64
layer nothing is cast.

**The layers' inputs** (:func:`input_covariances`): the input covariance of every layer over a pass of
data, what InfLoRA designs its ``A_t`` from and what LoRA subtraction's projection is made from.

**The model** (:class:`LoRASumViT`). Unlike CoLoR's routed experts, nothing is routed: every sample
runs one forward through the backbone with all components summed, then the one linear head. The head
grows with the classes of each training experience (new rows as ``nn.Linear`` initialises them; old
rows kept); classes never trained get ``-inf``. The learned state (components, method parameters,
head, class masks) is the model's :meth:`~LoRASumViT.experts_state_dict`, without the frozen backbone,
so the package's checkpoint and resume (:func:`~avalanche_color.train_stream`) and
:meth:`~LoRASumViT.save_pretrained` keep only that.

**Its folder** (:func:`save_folder`, :func:`load_folder`; CL-LoRA's model is saved the same way):
``weights.safetensors`` plus ``config.json``. The folder holds the model's
:meth:`~LoRASumViT.experts_state_dict` (components, magnitudes or protected subspaces, head, class masks),
never the backbone; ``config.json`` names the model class, its options, a digest of the backbone's
weights, and the size and SHA-256 of the weights file, which holds a copy of the rest of ``config.json``.
Loading checks those first (:mod:`~avalanche_color.experts.saved`, as CoLoR's folders: a changed,
truncated or foreign file, or an edited ``config.json``, is a ``SavedModelError`` naming it), builds the
model on a copy of the backbone given, refuses another backbone or class, and predicts bit-identically.
(CoLoR's own format, :mod:`avalanche_color.experts.saved`, is tied to routed experts.)
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional, TypeVar

import torch
from avalanche.models import DynamicModule
from torch import Tensor, nn

from avalanche_color.config import Options
from avalanche_color.experts.routed_vit import (backbone_images, check_classes, check_experience_images,
                                                check_vision_transformer)
from avalanche_color.experts.saved import (backbone_fingerprint, check_config_unchanged, load_tensors,
                                           read_saved_folder, read_verified, write_saved_folder)
from avalanche_color.lora import QVLoRA, expert_tokens, fused_qkv_width, trained_dtype
from avalanche_color.peers.lora_sum.config import DirectionNorm
from avalanche_color.utils.experiences import experience_classes
from avalanche_color.utils.files import PathLike
from avalanche_color.utils.rng import seeded
from avalanche_color.utils.state import host_value, keep_host_value, take_stored_shapes, train_only
from avalanche_color.version import __version__


Part = Literal["q", "k", "v"]
PARTS: tuple[str, ...] = ("q", "k", "v")


@dataclass(frozen=True)
class Mixing:
    """How the components of one forward are weighted.

    Attributes:
        magnitudes: one scalar per component (SD-LoRA's alpha_i); None: every coefficient is 1 (InfLoRA).
        normalised: per component, whether its update is divided by its norm (SD-LoRA's finished directions).
        norm: ``"factors"``: ``||B||_F ||A||_F`` (the SD-LoRA code); ``"product"``: ``||B A||_F`` (its paper).
        low_rank: the components that run low-rank, down and up (those whose A or B train: what their
            gradients need); the others are folded into the weight.
    """

    magnitudes: Optional[Sequence[Tensor]] = None
    normalised: Sequence[bool] = ()
    norm: DirectionNorm = "factors"
    low_rank: frozenset[int] = frozenset()


def direction_norm(A: Tensor, B: Tensor, norm: DirectionNorm) -> Tensor:
    """``||B A||_F`` (without forming the d x d product) or ``||B||_F ||A||_F``, in at least float32
    (sums of squares under- and overflow in half precision)."""
    dtype = torch.promote_types(A.dtype, torch.float32)
    A, B = A.to(dtype), B.to(dtype)
    if norm == "factors":
        return torch.linalg.matrix_norm(B) * torch.linalg.matrix_norm(A)
    # ||BA||_F^2 = trace(A^T B^T B A) = sum((A A^T) * (B^T B)), all r x r.
    return ((A @ A.T) * (B.T @ B)).sum().clamp_min(0).sqrt()


class LoRASumQKV(nn.Module):
    """One timm ``attn.qkv`` with a growing list of LoRA components on two of its parts.

    Args:
        base_layer: the fused ``nn.Linear`` whose output is ``[q | k | v]``; it stays frozen.
        parts: the two adapted parts, e.g. ``("q", "v")`` (SD-LoRA) or ``("k", "v")`` (InfLoRA).
    """

    def __init__(self, base_layer: nn.Linear, parts: tuple[Part, Part]) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.width = fused_qkv_width(base_layer)
        self.parts = tuple(PARTS.index(part) for part in parts)
        self.components = nn.ModuleList()

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    def add_component(self, rank: int) -> QVLoRA:
        """A new component (B zeros: the layer's output is unchanged), on the layer's device: float32 on a
        bfloat16 or float16 layer (see :func:`~avalanche_color.lora.trained_dtype`), else in the layer's dtype."""
        weight = self.base_layer.weight
        component = QVLoRA(self.in_features, self.width, rank, alpha=rank).to(weight.device,
                                                                              trained_dtype(weight.dtype))
        self.components.append(component)
        return component

    def coefficients(self, mixing: Mixing) -> list[list[Tensor]]:
        """Per adapted part, each component's coefficient ``c_i`` (0-d tensors, in at least float32:
        ``alpha / ||B A||`` of a small direction overflows half precision)."""
        ones = [self.base_layer.weight.new_ones((), dtype=torch.float32) for _ in self.components]
        magnitudes = ones if mixing.magnitudes is None else list(mixing.magnitudes)
        result = []
        for index in range(2):
            row = []
            for i, component in enumerate(self.components):
                c = magnitudes[i].to(torch.promote_types(magnitudes[i].dtype, torch.float32))
                if i < len(mixing.normalised) and mixing.normalised[i]:
                    norm = direction_norm(component.A[index], component.B[index], mixing.norm).to(c.dtype)
                    # A direction that learned nothing (B = 0: an experience stopped before its first step,
                    # as early stopping may leave it) adds nothing, rather than 0 / 0 = NaN everywhere.
                    c = torch.where(norm > 0, c / torch.where(norm > 0, norm, torch.ones_like(norm)), 0.0)
                row.append(c)
            result.append(row)
        return result

    def forward(self, x: Tensor, mixing: Optional[Mixing] = None) -> Tensor:
        """``[q | k | v]`` of ``x`` plus every component's update on the adapted parts.

        The components named in ``mixing.low_rank`` run low-rank, down and up (what the gradients of
        trained factors need); the others are folded into the weight, one matmul for all.
        """
        if not len(self.components):
            return self.base_layer(x)
        mixing = mixing or Mixing()
        coefficients = self.coefficients(mixing)
        frozen = [i for i in range(len(self.components)) if i not in mixing.low_rank]
        weight = self.base_layer.weight
        if frozen:
            parts = list(weight.split(self.width))
            for index, part in enumerate(self.parts):
                down = torch.cat([self.components[i].A[index] for i in frozen]).to(weight.dtype)
                parts[part] = parts[part] + self._scaled_up(coefficients[index], frozen, index, weight.dtype) @ down
            weight = torch.cat(parts)
        out = nn.functional.linear(x, weight, self.base_layer.bias)
        training = [i for i in range(len(self.components)) if i not in frozen]
        if not training:
            return out
        pieces = list(out.split(self.width, dim=-1))
        for index, part in enumerate(self.parts):
            down = torch.cat([self.components[i].A[index] for i in training]).to(x.dtype)  # (sum r_i, in)
            pieces[part] = pieces[part] + (x @ down.T) @ self._scaled_up(coefficients[index], training, index,
                                                                         x.dtype).T
        return torch.cat(pieces, dim=-1)

    def _scaled_up(self, coefficients: list[Tensor], components: list[int], index: int, dtype: torch.dtype) -> Tensor:
        """(out, sum r_i): the components' B of part ``index``, each times its coefficient (in float32 or wider,
        and never narrower than B: a float64 B is not rounded to a float32 coefficient's precision)."""
        scaled = []
        for i in components:
            B = self.components[i].B[index]
            wide = torch.promote_types(coefficients[i].dtype, B.dtype)
            scaled.append((coefficients[i].to(wide) * B.to(wide)).to(dtype))
        return torch.cat(scaled, dim=1)

    def delta_weight(self, component: int, mixing: Optional[Mixing] = None) -> Tensor:
        """(2, out, in): one component's weighted update of the two adapted parts (for tests and analysis)."""
        c = self.components[component]
        coefficients = self.coefficients(mixing or Mixing())
        return torch.stack([(coefficients[i][component] * c.B[i].to(torch.float64)).to(c.A.dtype) @ c.A[i]
                            for i in range(2)])


class CovarianceSum:
    """Running ``sum x x^T`` (float64) and token count of one layer's inputs."""

    def __init__(self, width: int, device: torch.device) -> None:
        self.sum = torch.zeros(width, width, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, x: Tensor) -> None:
        tokens = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
        self.sum += tokens.T @ tokens
        self.count += tokens.shape[0]

    def mean(self) -> Tensor:
        return self.sum / max(self.count, 1)


@contextmanager
def input_covariances(layers: Sequence[nn.Module]) -> Iterator[list[CovarianceSum]]:
    """While open, every forward adds each layer's inputs to that layer's :class:`CovarianceSum`."""
    sums = [CovarianceSum(layer.in_features, layer.base_layer.weight.device) for layer in layers]
    handles = [layer.register_forward_pre_hook(lambda _, args, s=s: s.add(args[0]))
               for layer, s in zip(layers, sums)]
    try:
        yield sums
    finally:
        for handle in handles:
            handle.remove()


Model = TypeVar("Model", bound="LoRASumViT")
# The first block's A of each component: the components' ranks, in order.
_COMPONENT_A = re.compile(r"^backbone\.blocks\.0\.attn\.qkv\.components\.(\d+)\.A$")


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
        # The head is float32 beside a bfloat16 backbone (lora.trained_dtype; features are cast up to it, so the
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

    def experience_parameter_count(self, component: int, num_classes: Optional[int]) -> int:
        """What the experience of ``component`` trains when it brings ``num_classes`` classes: the
        component's own parameters, what the method trains beside it, and the head's new rows.
        The runner reports it for the first experience, as the papers count."""
        if num_classes is None:
            raise ValueError(f"num_classes is needed to count what an experience of {type(self).__name__} trains "
                             f"(its head rows are its classes'), got None")
        return self.component_parameter_count(component) + (int(self.backbone.num_features) + 1) * num_classes

    def set_trainable(self) -> None:
        """The one place that sets ``requires_grad``: on :meth:`trainable_parameters`, off everywhere else."""
        train_only(self, self.trainable_parameters())

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
        tokens = expert_tokens(self.backbone, backbone_images(self.backbone, x), self.mixing())
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
        frozen = {name for name, _ in self.backbone.named_parameters() if ".components." not in name}
        frozen |= {name for name, _ in self.backbone.named_buffers() if ".components." not in name}
        return {k: v for k, v in self.state_dict().items()
                if not (k.startswith("backbone.") and k.removeprefix("backbone.") in frozen)}

    def save_pretrained(self, folder: PathLike) -> Path:
        """Write the learned state (no backbone) and ``config.json`` into ``folder``, atomically."""
        return save_folder(self, folder)

    @classmethod
    def from_pretrained(cls: type[Model], folder: PathLike, backbone: nn.Module) -> Model:
        """The model saved in ``folder`` on a copy of ``backbone`` (the ViT it was trained on), in eval mode."""
        return load_folder(cls, folder, backbone)

    def load_experts_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load :meth:`experts_state_dict` into this model: its components and head grown to the state's first; a
        state that still does not fit (missing or unexpected entries) is refused naming them."""
        ranks = {int(m.group(1)): state[k].shape[1] for k in state if (m := _COMPONENT_A.match(k))}
        for index in range(self.num_experts, len(ranks)):
            self.start_component(ranks[index])
        self.grow_head(state["head_weight"].shape[0])
        take_stored_shapes(self, state, "", ("finished", "trained_classes", "current_classes"))
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if k in self.experts_state_dict()]
        if missing or unexpected:
            raise ValueError(f"the state does not fit this {type(self).__name__}: missing {missing}, "
                             f"unexpected {unexpected}")
        self.max_class_label = max(self.max_class_label, len(self.trained_classes))
        self.set_trainable()  # what trains follows the loaded state: nothing of a finished component


FORMAT = "avalanche_color.lora_sum"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"
# A LoRA-peer model saved as a folder: a LoRASumViT, or CL-LoRA's model (which is not one).
Saved = TypeVar("Saved", bound=nn.Module)


def save_folder(model: nn.Module, folder: PathLike) -> Path:
    """Write ``model``'s learned state and ``config.json`` into ``folder``, atomically."""
    config = {"format": FORMAT, "version": __version__, "model": type(model).__name__,
              "options": model.config.as_dict(), "max_class_label": model.max_class_label,
              "backbone": backbone_fingerprint(model)}
    return write_saved_folder(folder, model.experts_state_dict(), config, tensors_file=WEIGHTS_FILE,
                              config_file=CONFIG_FILE)


def load_folder(model_class: type[Saved], folder: PathLike, backbone: nn.Module) -> Saved:
    """A ``model_class`` on a copy of ``backbone`` with the state saved in ``folder``, in eval mode."""
    folder = Path(folder)
    saved = read_saved_folder(folder, tensors_file=WEIGHTS_FILE, config_file=CONFIG_FILE, form=FORMAT,
                              what="a saved SD-LoRA, InfLoRA, LoRA subtraction or CL-LoRA model",
                              keys=("model", "options", "backbone", "max_class_label", "files"),
                              model_class=model_class.__name__)
    data = read_verified(folder, WEIGHTS_FILE, saved["files"])
    check_config_unchanged(folder, CONFIG_FILE, saved, WEIGHTS_FILE, data)  # before any option is used
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["options"].items()}
    model = model_class(backbone, model_class.config_class.from_saved(options))
    digest = backbone_fingerprint(model)
    if digest != saved["backbone"]:
        raise ValueError(f"{folder} does not fit this backbone: its components were trained on another one "
                         f"(weights digest {saved['backbone'][:12]}, this backbone's {digest[:12]})")
    tensors = load_tensors(folder, WEIGHTS_FILE, data)
    model.load_experts_state_dict({key: value.to(model.device) for key, value in tensors.items()})
    model.max_class_label = max(model.max_class_label, int(saved["max_class_label"]))
    return model.eval()
