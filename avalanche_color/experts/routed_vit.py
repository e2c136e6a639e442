"""A frozen timm ViT with one expert and one head per experience, and a router that picks the expert.

The model composes the frozen backbone, which a subclass runs with given experts (:meth:`RoutedExpertViT.features`:
LoRA matrices in the attention blocks for CoLoR's :class:`~avalanche_color.ExpertViT`, prompt tokens for
S-Prompts' :class:`~avalanche_color.PromptExpertViT`), the expert bank (:mod:`avalanche_color.experts.bank`:
experts, heads, records, which one trains) and the router (:mod:`avalanche_color.routing.router`).
An eval-mode ``model(x)`` makes one backbone pass for the routing features (none for the oracle)
and one with the chosen experts; the experts chosen are kept in one declared place,
:attr:`RoutedExpertViT.routed_experts`, where the routing-accuracy metric reads them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional, TypeVar, Union

import torch
from avalanche.models import MultiTaskModule
from torch import Tensor, nn

from avalanche_color.config import RoutingOptions
from avalanche_color.experts.adaptation import adapt_to_experience
from avalanche_color.experts.backbone import backbone_dtype, check_vision_transformer
from avalanche_color.experts.bank import ExpertBank, ExpertKind
from avalanche_color.experts.expert_routing import ExpertRouting
from avalanche_color.experts.heads import ExpertHead, check_classes
from avalanche_color.experts.prediction import MixedKernel, check_experts, predict
from avalanche_color.experts.pretrained import from_pretrained, save_pretrained
from avalanche_color.experts.stored_state import check_stored_shapes, stored_expert_classes
from avalanche_color.lora.dtypes import trained_dtype
from avalanche_color.lora.segments import ExpertSelection
from avalanche_color.routing.eval_cache import EvalCache
from avalanche_color.routing.routers import make_router
from avalanche_color.utils.files import PathLike

Model = TypeVar("Model", bound="RoutedExpertViT")


class RoutedExpertViT(ExpertRouting, MultiTaskModule):
    """Base of the routed expert models: a frozen ViT, an expert bank, a router.

    ``model(x, task_labels=None, experts=None)`` gives global-class logits (classes the chosen
    expert does not know get ``-inf``). Which experts compute them:

    * ``experts`` given (an index, or one per sample): those, in either mode;
    * no expert yet: zeros (Avalanche evaluates once before the first training step);
    * train mode: the expert that trains, for every sample (a ``RuntimeError`` once every expert
      is finished: call ``model.eval()``);
    * eval mode: each sample's routed expert, kept in :attr:`routed_experts`.

    Subclasses give ``__init__`` their :class:`~avalanche_color.experts.bank.ExpertKind` (the slots and
    how a new expert is made), implement :meth:`features`, and set ``options_class`` and
    ``expert_shape_options`` (the options that decide the experts' shapes).

    Args:
        vit: a timm ``VisionTransformer``; it is frozen (and may be adapted in place).
        config: the model's options (:class:`~avalanche_color.config.RoutingOptions` or a subclass).
        kind: the slots to which every expert adds one module (see :class:`ExpertBank`), and how a new
            expert's modules are made.
    """

    options_class: ClassVar[type[RoutingOptions]] = RoutingOptions
    expert_shape_options: ClassVar[tuple[str, ...]] = ()
    # How a batch that mixes experts is computed (experts.prediction): "gathered" and "auto" (gathered on
    # CUDA) need a features() that takes one expert per sample as a tensor; set it to force a kernel.
    mixed_kernel: MixedKernel = "segments"
    routed_experts: Optional[Tensor]
    # (number of heads, one past their largest class id) as Python ints: read from the heads' class tensors
    # once per change (an expert added, a state loaded), not in every forward (a host sync on a GPU).
    _head_classes: Optional[tuple[int, int]] = None
    """The experts the last eval-mode forward routed its batch to (all ranks' under torchrun, see
    :func:`~avalanche_color.training.distributed.gather_eval_batch`); None after any other forward."""

    def __init__(self, vit: nn.Module, config: RoutingOptions, kind: ExpertKind) -> None:
        super().__init__()
        check_vision_transformer(vit)
        self.config = config
        self.backbone = vit.requires_grad_(False).eval()
        # What the backbone owns, recorded once, before any expert exists: never saved with the experts.
        self.backbone_keys = frozenset(self.backbone.state_dict(prefix="backbone."))
        self.expert_kind = kind
        self.bank = ExpertBank(kind.slots)
        self._head_classes = (0, 0)  # no head yet: known without a read
        self.router = make_router(config, self.num_features)
        self.eval_cache: Optional[EvalCache] = (EvalCache(config.cache_evaluation_bytes) if config.cache_evaluation
                                                else None)
        self.routed_experts = None
        self.register_load_state_dict_post_hook(RoutedExpertViT._after_loading)

    def new_expert_modules(self) -> list[nn.Module]:
        """The modules of one new expert, one per slot, not yet added (made by the model's expert kind)."""
        return self.expert_kind.new_expert_modules()

    def features(self, x: Tensor, experts: ExpertSelection = None, trained: Optional[int] = None) -> Tensor:
        """The pooled features (batch, num_features) with ``experts``: None, one index, or ``Segments``
        (:mod:`avalanche_color.lora.segments`) of a batch sorted by expert. ``trained``: the expert
        that trains, computed so that gradients reach it (the others are computed frozen)."""
        raise NotImplementedError

    @property
    def num_experts(self) -> int:
        return len(self.bank)

    @property
    def num_features(self) -> int:
        return int(self.backbone.num_features)

    @property
    def num_classes(self) -> int:
        """One past the largest class id of any expert or adapted experience (Avalanche adapts the
        model to evaluation experiences too: classes no expert knows yet get -inf)."""
        heads = self.bank.heads
        if self._head_classes is None or self._head_classes[0] != len(heads):
            self._head_classes = (len(heads), max((int(h.classes.max()) + 1 for h in heads), default=0))
        return max(self._head_classes[1], self.max_class_label)

    @property
    def device(self) -> torch.device:
        return self.backbone.patch_embed.proj.weight.device

    def start_expert(self, classes: Sequence[int], experience: int = -1, task: int = 0) -> int:
        """Add an expert for ``classes``; it is the one that trains (every other is frozen). Returns its index."""
        check_classes(classes)  # before anything is made
        modules = self.new_expert_modules()  # before the head: the order the initialisations draw in
        head = ExpertHead(self.num_features, classes).to(self.device, trained_dtype(backbone_dtype(self.backbone)))
        known = self._head_classes
        index = self.bank.start_expert(modules, head, experience, task)
        if known is not None and known[0] == len(self.bank.heads) - 1:  # the class count from the ids given
            self._head_classes = (len(self.bank.heads), max(known[1], max(int(c) for c in classes) + 1))
        return index


    def finish_expert(self, expert: int) -> None:
        """End ``expert``'s experience: it is frozen for good, and so is its router state."""
        self.bank.finish_expert(expert)
        self.router.finish(expert)

    def expert_parameters(self, expert: int) -> Iterator[nn.Parameter]:
        """The parameters of one expert: its own modules' and its head's."""
        return self.bank.expert_parameters(expert)

    def experience_parameter_count(self, experience: int, num_classes: Optional[int] = None) -> int:
        """What ``experience`` trains: its expert (modules and head, whose rows are its ``num_classes``
        classes already). The runner reports it for the first experience, as the paper counts."""
        return sum(p.numel() for p in self.expert_parameters(experience))

    def adaptation(self, experience: Any) -> None:
        """Avalanche's hook before each experience: a new expert for each training experience
        (see :func:`~avalanche_color.experts.adaptation.adapt_to_experience`)."""
        adapt_to_experience(self, experience)

    def forward(self, x: Tensor, task_labels: Optional[Tensor] = None,
                experts: Union[int, Tensor, None] = None) -> Tensor:
        """Global-class logits of images ``x`` (batch, channels, height, width): pick the experts (see the class
        docstring), then :func:`~avalanche_color.experts.prediction.predict`. ``task_labels``: one per sample,
        for the oracle; ``experts``: an index, or one per sample."""
        self.routed_experts = None
        if experts is not None:
            experts = check_experts(experts, x.shape[0], self.num_experts, self.device)
        elif not self.num_experts:
            return x.new_zeros(x.shape[0], self.num_classes)
        elif self.training:
            experts = self.training_expert()
        elif self.eval_cache is not None:
            logits, self.routed_experts = self.route_and_predict(x, task_labels)
            return logits
        else:
            experts = self.routed_experts = self.route(x, task_labels)
        return predict(self.features, self.bank.heads, self.num_classes, x, experts, self.bank.trainable,
                       self.mixed_kernel)

    def training_expert(self) -> int:
        """The expert that trains: a train-mode forward predicts with it (a ``RuntimeError`` if none does)."""
        if self.bank.trainable is None:
            raise RuntimeError(
                f"{type(self).__name__} is in train mode, where the expert being trained predicts every "
                f"sample, but none of its {self.num_experts} experts trains: call model.eval() to route "
                f"each sample to its expert (a strategy's train() adds a new expert first)"
            )
        return self.bank.trainable

    def predict(self, x: Tensor, experts: Union[int, Tensor]) -> Tensor:
        """Logits of the given experts: one index for the batch, or one per sample (a mixed batch is
        computed by ``mixed_kernel``, see :mod:`~avalanche_color.experts.prediction`)."""
        return predict(self.features, self.bank.heads, self.num_classes, x, experts, self.bank.trainable,
                       self.mixed_kernel)

    def train(self, mode: bool = True) -> "RoutedExpertViT":
        super().train(mode)
        self.backbone.eval()  # frozen parts never see dropout or drop-path noise
        return self

    def experts_state_dict(self) -> dict[str, Tensor]:
        """The learned state (experts, heads, records, router), without the backbone."""
        return {k: v for k, v in self.state_dict().items() if k not in self.backbone_keys}

    def load_experts_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load what :meth:`experts_state_dict` gave; the backbone stays as it is."""
        result = self.load_state_dict(state, strict=False)
        missing = [k for k in result.missing_keys if k not in self.backbone_keys]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"state does not fit this model: missing {missing}, unexpected {result.unexpected_keys}"
            )

    def save_pretrained(self, folder: PathLike) -> Path:
        """Write the experts (safetensors) and a JSON config to ``folder``, to share without the backbone
        (:mod:`avalanche_color.experts.pretrained`; :meth:`from_pretrained` loads it)."""
        return save_pretrained(self, folder)

    @classmethod
    def from_pretrained(cls: type[Model], folder: PathLike, backbone: nn.Module, **options: Any) -> Model:
        """The model saved in ``folder`` on a copy of ``backbone`` (the one it was trained on), in eval mode;
        a backbone with other weights, another model class or ``options`` that change what the experts
        mean are refused, naming each difference (others, e.g. ``cache_evaluation``, may be given)."""
        return from_pretrained(cls, folder, backbone, **options)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # The experts grow to the stored count, and the children load into them.
        options = ", ".join(f"{name}={getattr(self.config, name)!r}" for name in self.expert_shape_options)
        check_stored_shapes(self, self.bank.slots, self.new_expert_modules(), state_dict, prefix, options)
        for classes in stored_expert_classes(state_dict, prefix)[self.num_experts:]:
            self.start_expert(classes)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _after_loading(self, *_: Any) -> None:
        # After any load_state_dict: the newest unfinished expert trains, cached work is dropped, and the
        # class count is read again from the loaded heads.
        self._head_classes = None
        self.bank.set_trainable(self.bank.newest_unfinished())
        if self.eval_cache is not None:
            self.eval_cache.clear()
