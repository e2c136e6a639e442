"""A frozen timm ViT with one expert and one head per experience, routed by prototypes.

What an *expert* is differs per method: LoRA matrices inside the attention
blocks (CoLoR, :class:`~avalanche_color.ExpertViT`) or prompt tokens added to
the token sequence (S-Prompts, :class:`~avalanche_color.PromptExpertViT`).
Everything else is shared and lives here: the heads, which experience and task
each expert comes from, Avalanche's model adaptation, the prototype router
(nearest prototype, CoLoR++'s first-expert features, or the oracle), the
batched prediction of a mixed batch and the state handling. A subclass only
says where its experts' modules live (:meth:`RoutedExpertViT.expert_slots`), how to
make one, and how the backbone computes features with given experts.

The expert of each sample is an argument or a return value, never state left on the model:
:meth:`RoutedExpertViT.route` returns the experts, :meth:`RoutedExpertViT.predict` runs given
experts, and ``model(x, experts=...)`` or ``model(x)`` does one or both (see
:meth:`RoutedExpertViT.forward` for its paths).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional, TypeVar, Union

import torch
from avalanche.models import MultiTaskModule
from torch import Tensor, nn

from avalanche_color.config import RoutingOptions
from avalanche_color.experts.backbone import backbone_dtype, check_images, check_vision_transformer
from avalanche_color.experts.heads import ExpertHead
from avalanche_color.experts.pretrained import from_pretrained, save_pretrained
from avalanche_color.routing.class_router import ClassRouter
from avalanche_color.routing.eval_cache import EvalCache, image_keys
from avalanche_color.routing.router import PrototypeRouter
from avalanche_color.lora.segments import ExpertSelection, Segments, segments_of
from avalanche_color.utils.experiences import (experience_classes, experience_task_labels,
                                                  refuse_chunks_without_boundaries)
from avalanche_color.utils.files import PathLike
from avalanche_color.utils.state import take_stored_shapes

Model = TypeVar("Model", bound="RoutedExpertViT")


class RoutedExpertViT(MultiTaskModule):
    """Base of the routed expert models: a frozen ViT, one expert and head per experience.

    In training mode the newest expert predicts while it is trained (Avalanche's model
    adaptation adds one per training experience, see :meth:`adaptation`); once every expert
    is finished, a train-mode forward raises a ``RuntimeError`` saying to call ``model.eval()``
    rather than predicting differently from eval mode. In eval mode each sample is
    routed to the expert of its nearest prototype, or, with ``routing="oracle"``,
    to the expert trained on its task label. Outputs cover the global class
    space: classes the chosen expert does not know get ``-inf``.

    Subclasses implement :meth:`expert_slots`, :meth:`new_expert_modules` and
    :meth:`features`, and name in ``expert_shape_options`` the options that decide
    the shapes of an expert's tensors.

    Args:
        vit: a timm ``VisionTransformer``; it is frozen (and may be adapted in place).
        config: the model's options (:class:`~avalanche_color.config.RoutingOptions`
            or a subclass: routing, distance, feature normalisation, evaluation cache).
    """

    expert_experiences: Tensor
    expert_tasks: Tensor
    expert_finished: Tensor
    expert_shape_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, vit: nn.Module, config: RoutingOptions) -> None:
        super().__init__()
        check_vision_transformer(vit)
        self.config = config
        self.backbone = vit.requires_grad_(False).eval()
        # What the backbone owns, recorded once, before any expert exists: never saved with the experts.
        self.backbone_keys = frozenset(self.backbone.state_dict(prefix="backbone."))
        self.heads = nn.ModuleList()
        self.router = PrototypeRouter(config.distance)
        # Beyond the paper: a class-level router (off by default), fitted alongside the prototypes.
        self.class_router = (None if config.router == "prototypes"
                             else ClassRouter(config.router, self.num_features, config.router_width))
        # Where each expert comes from: its training experience and task label (only oracle
        # routing reads it; an experience with several labels, routed otherwise, records its smallest).
        self.register_buffer("expert_experiences", torch.empty(0, dtype=torch.long))
        self.register_buffer("expert_tasks", torch.empty(0, dtype=torch.long))
        # Whether each expert's experience is over (its final prototypes fitted).
        self.register_buffer("expert_finished", torch.empty(0, dtype=torch.bool))
        self.eval_cache: Optional[EvalCache] = EvalCache() if config.cache_evaluation else None

    @property
    def routing(self) -> str:
        return self.config.routing

    # ------------------------------------------------------------------ what an expert is

    def expert_slots(self) -> list[nn.ModuleList]:
        """Where experts live: lists to which every expert adds one module (its head excluded)."""
        raise NotImplementedError

    def new_expert_modules(self) -> list[nn.Module]:
        """The modules of one new expert, one per slot of :meth:`expert_slots`, not yet added."""
        raise NotImplementedError

    def features(self, x: Tensor, experts: ExpertSelection = None) -> Tensor:
        """The pooled features (batch, num_features) with ``experts``: None, one index,
        or ``Segments`` (:mod:`avalanche_color.lora.segments`) of a batch sorted by expert."""
        raise NotImplementedError

    # ------------------------------------------------------------------ experts

    @property
    def num_experts(self) -> int:
        return len(self.heads)

    @property
    def num_features(self) -> int:
        return int(self.backbone.num_features)

    @property
    def num_classes(self) -> int:
        """Width of the output: one past the largest class id of any expert or adapted experience.

        Avalanche adapts the model to evaluation experiences too, so the output
        also covers classes no expert knows yet (their logits are -inf).
        """
        known = max((int(h.classes.max()) + 1 for h in self.heads), default=0)
        return max(known, self.max_class_label)

    @property
    def device(self) -> torch.device:
        return self.backbone.patch_embed.proj.weight.device

    def add_expert(self, classes: Sequence[int], experience: int = -1, task: int = 0) -> int:
        """Add a trainable expert for ``classes`` and freeze all earlier ones.

        Returns:
            the new expert's index.
        """
        if len(classes) == 0:
            raise ValueError("classes must name at least one class, got an empty sequence")
        if min(classes) < 0:
            raise ValueError(f"classes must be non-negative class ids, got {sorted(classes)}")
        for parameter in self.parameters():  # earlier experts freeze; stale gradients go
            parameter.requires_grad_(False)
            parameter.grad = None
        self._add_expert_modules()
        self.heads.append(ExpertHead(self.num_features, classes).to(self.device, backbone_dtype(self.backbone)))
        origin = self.expert_experiences.new_tensor
        self.expert_experiences = torch.cat((self.expert_experiences, origin([experience])))
        self.expert_tasks = torch.cat((self.expert_tasks, origin([task])))
        self.expert_finished = torch.cat((self.expert_finished, self.expert_finished.new_zeros(1)))
        return self.num_experts - 1

    def finish_expert(self, expert: int) -> None:
        """Mark ``expert``'s experience as over: training on that experience again adds a further expert."""
        self.expert_finished[expert] = True
        if self.class_router is not None:
            self.class_router.finish(expert)

    def current_expert(self, experience: int) -> Optional[int]:
        """The newest expert if it belongs to ``experience`` and is not finished (a run resumed inside it)."""
        newest = self.num_experts - 1
        if newest >= 0 and int(self.expert_experiences[newest]) == experience and not bool(self.expert_finished[newest]):
            return newest
        return None

    def expert_modules(self, expert: int) -> Iterator[nn.Module]:
        """The modules that hold ``expert``'s own parameters, its head excluded."""
        for slot in self.expert_slots():
            yield slot[expert]

    def _add_expert_modules(self) -> None:
        for slot, module in zip(self.expert_slots(), self.new_expert_modules(), strict=True):
            slot.append(module.to(self.device))

    def expert_parameters(self, expert: int) -> Iterator[nn.Parameter]:
        """The parameters of one expert: its own modules' and its head's."""
        for module in self.expert_modules(expert):
            yield from module.parameters()
        yield from self.heads[expert].parameters()

    def is_frozen(self, expert: int) -> bool:
        """Whether ``expert`` is done training (only the newest expert ever trains)."""
        return not any(p.requires_grad for p in self.expert_parameters(expert))

    def adaptation(self, experience: Any) -> None:
        """Avalanche's hook before each experience: a new expert for each training experience.

        Training on an experience again (a revisit) adds a further expert for it;
        only an unfinished expert of the same experience (a run resumed inside it, or the
        next chunk of an online stream with task boundaries, whose origin experience
        Avalanche passes here) is continued. An experience may hold several task labels,
        except with ``routing="oracle"``, which finds an expert by its one task label.
        """
        classes, tasks = experience_classes(experience), experience_task_labels(experience)
        if classes:  # MultiTaskModule's bookkeeping, for experiences of any generator
            self.max_class_label = max(self.max_class_label, classes[-1] + 1)
        if not self.training:
            return
        refuse_chunks_without_boundaries(experience, type(self).__name__)
        self.known_train_tasks_labels = self.known_train_tasks_labels | set(tasks)
        experience_id = int(experience.current_experience)
        if self.current_expert(experience_id) is not None:
            return
        if len(experience.dataset) == 0:
            raise ValueError(f"experience {experience_id} has no samples")
        if self.routing == "oracle":
            if len(tasks) != 1:
                raise ValueError(f"routing='oracle' routes by task label, so experience {experience_id} must "
                                 f"have one task label, got {tasks}")
            self._check_distinct_task(tasks[0], experience_id)
        # Refuse unusable images before the expert exists, not at the first forward.
        check_images(self.backbone, torch.as_tensor(experience.dataset[0][0]).unsqueeze(0))
        self.add_expert(classes, experience_id, tasks[0])

    def _check_distinct_task(self, task: int, experience: int) -> None:
        """Oracle routing finds an expert by task label: refuse a label another experience already has."""
        for other_experience, other_task in zip(self.expert_experiences.tolist(), self.expert_tasks.tolist()):
            if other_task == task and other_experience != experience:
                raise ValueError(
                    f"routing='oracle' routes by task label, so every experience needs its own: experience "
                    f"{experience} has task label {task}, like experience {other_experience}. Use a "
                    f"task-incremental stream (e.g. task_incremental_benchmark, or nc_benchmark(..., "
                    f"task_labels=True)), or routing='backbone' (CoLoR) or 'first_expert' (CoLoR++)"
                )

    def experts_of_tasks(self, task_labels: Tensor) -> Tensor:
        """The newest expert trained on each sample's task label (oracle routing)."""
        tasks = self.expert_tasks.tolist()
        unknown = set(task_labels.unique().tolist()) - set(tasks)
        if unknown:
            raise ValueError(f"task labels {sorted(unknown)} have no expert; known: {sorted(set(tasks))}")
        lookup = torch.full((max(tasks) + 1,), -1, dtype=torch.long, device=task_labels.device)
        for expert, task in enumerate(tasks):  # a revisited task: its newest expert
            lookup[task] = expert
        return lookup[task_labels.long()]

    # ------------------------------------------------------------------ routing and forward

    def routing_features(self, x: Tensor) -> Tensor:
        """The features prototypes are made of and samples are routed by."""
        if self.routing == "first_expert":
            if not self.num_experts:
                raise RuntimeError("routing='first_expert' needs a trained first expert")
            features = self.features(x, 0)
        else:
            features = self.features(x)
        if self.config.normalize_features:
            features = nn.functional.normalize(features, dim=-1)
        return features

    def route(self, x: Tensor, task_labels: Optional[Tensor] = None,
              keys: Optional[list[bytes]] = None) -> Tensor:
        """The expert index for each sample: its nearest prototype's, the class router's, or its task's (oracle).

        ``keys`` (the images' content hashes) let the evaluation cache supply
        routing features it has computed before, while the routing features are frozen.
        """
        if self.routing == "oracle":
            if task_labels is None:
                raise ValueError("routing='oracle' needs task_labels, one per sample")
            task_labels = torch.as_tensor(task_labels, device=x.device).expand(x.shape[0])
            return self.experts_of_tasks(task_labels)
        if keys is not None and self.eval_cache is not None and self.routing_features_frozen():
            features = self.eval_cache.routing_features(x, keys, self.routing_features)
        else:
            features = self.routing_features(x)
        return self.router(features) if self.class_router is None else self.class_router(features)

    def routing_fitted(self, expert: int) -> bool:
        """Whether ``expert`` has what routing needs: its prototypes, and its class-router statistics."""
        fitted = expert in self.router.owners.tolist()
        return fitted and (self.class_router is None or self.class_router.knows(expert))

    def routing_features_frozen(self) -> bool:
        """Whether routing features stay the same for the rest of the run."""
        return self.routing != "first_expert" or self.is_frozen(0)

    def forward(self, x: Tensor, task_labels: Optional[Tensor] = None,
                experts: Union[int, Tensor, None] = None) -> Tensor:
        """Global-class logits. Which experts compute them, in this order:

        * ``experts`` given: those, in either mode (:meth:`predict`);
        * no expert yet: zeros, no preference among the classes (Avalanche evaluates once
          before the first training step);
        * train mode: the expert being trained, for every sample (:meth:`training_expert`);
        * eval mode: each sample's routed expert (:meth:`route_and_predict`, which also
          returns the experts; with ``cache_evaluation=True`` it reuses earlier work).

        Args:
            x: images (batch, channels, height, width) the backbone accepts.
            task_labels: one per sample; only oracle routing reads them.
            experts: an expert index for the whole batch, or a (batch,) tensor of indices.

        Raises:
            RuntimeError: in train mode when every expert is finished (call ``model.eval()``).
        """
        if experts is not None:
            return self.predict(x, self.check_experts(experts, x.shape[0]))
        if not self.num_experts:
            return x.new_zeros(x.shape[0], self.num_classes)
        if self.training:
            return self.predict(x, self.training_expert())
        return self.route_and_predict(x, task_labels)[0]

    def training_expert(self) -> int:
        """The expert a train-mode forward predicts with: the newest, while it is not finished.

        Raises:
            RuntimeError: when every expert is finished, as after loading: a train-mode prediction
                would then silently differ from the routed one eval mode gives.
        """
        newest = self.num_experts - 1
        if newest < 0 or bool(self.expert_finished[newest]):
            raise RuntimeError(
                f"{type(self).__name__} is in train mode, where the expert being trained predicts every "
                f"sample, but all its {self.num_experts} experts are finished: call model.eval() to route "
                f"each sample to its expert (a strategy's train() adds a new expert first)"
            )
        return newest

    def route_and_predict(self, x: Tensor, task_labels: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        """Routed prediction: the global-class logits and the expert each sample was routed to.

        The experts are None while the model has none (the logits are then zeros). With the
        evaluation cache on (``cache_evaluation=True``) routing features and frozen experts'
        logits of images seen before are reused: the same values, computed without gradients.
        """
        if not self.num_experts:
            return x.new_zeros(x.shape[0], self.num_classes), None
        if self.eval_cache is None:
            experts = self.route(x, task_labels)
            return self.predict(x, experts), experts
        with torch.no_grad():
            keys = image_keys(x)
            experts = self.route(x, task_labels, keys)
            return self.eval_cache.predict(x, keys, experts, self.num_classes, self.predict, self.is_frozen), experts

    def check_experts(self, experts: Union[int, Tensor], batch_size: int) -> Union[int, Tensor]:
        """Refuse ``experts`` that are not one index or one per sample of this model's experts."""
        allowed = f"an index in [0, {self.num_experts}) or a ({batch_size},) integer tensor of them"
        if isinstance(experts, Tensor):
            if experts.shape != (batch_size,) or experts.is_floating_point() or experts.is_complex():
                raise ValueError(f"experts must be {allowed}, got a {experts.dtype} tensor of shape "
                                 f"{tuple(experts.shape)}")
            if batch_size and not (0 <= int(experts.min()) and int(experts.max()) < self.num_experts):
                raise ValueError(f"experts must be {allowed}, got indices {sorted(set(experts.tolist()))}")
            return experts.to(self.device, torch.long)
        if isinstance(experts, bool) or not isinstance(experts, int) or not 0 <= experts < self.num_experts:
            raise ValueError(f"experts must be {allowed}, got {experts!r}")
        return experts

    def predict(self, x: Tensor, experts: Union[int, Tensor]) -> Tensor:
        """Logits of the given experts: one index for the batch, or one per sample.

        A mixed batch is sorted by expert, so that each expert acts on a
        contiguous run of samples, and put back in order at the end.
        """
        if isinstance(experts, Tensor) and experts.numel() and bool((experts == experts[0]).all()):
            experts = int(experts[0])  # one expert: no sorting needed
        if isinstance(experts, int):
            segments = [(experts, slice(None))]
            return self._logits(self.features(x, experts), segments)
        order = experts.argsort(stable=True)
        segments = segments_of(experts[order])
        sorted_logits = self._logits(self.features(x[order], segments), segments)
        logits = torch.empty_like(sorted_logits)
        logits[order] = sorted_logits
        return logits

    def _logits(self, features: Tensor, segments: Segments) -> Tensor:
        """Global-class logits: each run's head on its classes, -inf elsewhere."""
        logits = features.new_full((features.shape[0], self.num_classes), float("-inf"))
        for expert, run in segments:
            head = self.heads[expert]
            logits[run, head.classes] = head(features[run]).to(logits.dtype)  # under autocast the head may differ
        return logits

    # ------------------------------------------------------------------ modes and state

    def train(self, mode: bool = True) -> "RoutedExpertViT":
        super().train(mode)
        self.backbone.eval()  # frozen parts never see dropout or drop-path noise
        return self

    def experts_state_dict(self) -> dict[str, Tensor]:
        """The learned state (experts, heads, prototypes, class maps), without the backbone."""
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
        """Write the experts (safetensors) and a JSON config to ``folder``, to share without the backbone.

        See :mod:`avalanche_color.experts.pretrained`; :meth:`from_pretrained` loads it.
        """
        return save_pretrained(self, folder)

    @classmethod
    def from_pretrained(cls: type[Model], folder: PathLike, backbone: nn.Module, **options: Any) -> Model:
        """The model saved in ``folder`` on a copy of ``backbone`` (the one it was trained on), in eval mode.

        Refuses, naming each difference, a backbone with other weights, another model class,
        or ``options`` that change what the experts mean; others (``cache_evaluation``) may be given.
        """
        return from_pretrained(cls, folder, backbone, **options)

    def _check_stored_experts(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Refuse a stored state whose expert tensors have other shapes than this model's experts,
        naming the tensor and the options that decide the shapes (``expert_shape_options``)."""
        names = {id(module): name for name, module in self.named_modules()}
        for slot, module in zip(self.expert_slots(), self.new_expert_modules(), strict=True):
            expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
            slot_prefix = f"{prefix}{names[id(slot)]}."
            for key, tensor in state_dict.items():
                if not key.startswith(slot_prefix):
                    continue
                name = key[len(slot_prefix):].partition(".")[2]  # the key inside one expert's module
                if name in expected and tuple(tensor.shape) != expected[name]:
                    options = ", ".join(f"{option}={getattr(self.config, option)!r}"
                                        for option in self.expert_shape_options)
                    raise ValueError(f"state does not fit this model: {key[len(prefix):]} has shape "
                                     f"{tuple(tensor.shape)}, this model's experts have {expected[name]} "
                                     f"({options}); build the model with the options it was saved with")

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # Grow to the stored number of experts first; the children then load into them.
        stored = [k for k in state_dict if k.startswith(prefix + "heads.") and k.endswith(".classes")]
        self._check_stored_experts(state_dict, prefix)
        for index in range(self.num_experts, len(stored)):
            self.add_expert(state_dict[f"{prefix}heads.{index}.classes"].tolist())
        take_stored_shapes(self, state_dict, prefix, ("expert_experiences", "expert_tasks", "expert_finished"))
        super()._load_from_state_dict(state_dict, prefix, *args)

