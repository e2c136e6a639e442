"""The routed expert models: a frozen timm ViT with one expert and one head per experience, and a router
that picks each sample's expert; shared by CoLoR and S-Prompts.

The model composes the frozen backbone, which a subclass runs with given experts (:meth:`RoutedExpertViT.features`:
LoRA matrices in the attention blocks for CoLoR's :class:`~avalanche_color.ExpertViT`, prompt tokens for
S-Prompts' :class:`~avalanche_color.PromptExpertViT`), the expert bank (:class:`ExpertBank`:
experts, heads, records, which one trains) and the router (:mod:`avalanche_color.routing.routers`).
An eval-mode ``model(x)`` makes one backbone pass for the routing features (none for the oracle)
and one with the chosen experts; ``model(x, return_experts=True)`` returns the experts chosen beside the
logits, as :meth:`RoutedExpertViT.route_and_predict` does: a forward leaves no state behind.

From top to bottom: what the backbone must be (:func:`check_vision_transformer`, :func:`backbone_images`);
the heads (:class:`ExpertHead`); the expert bank (:class:`ExpertBank`, :class:`ExpertKind`); prediction with
given experts (:func:`predict`: one expert, or a mixed batch by one of two kernels); the evaluation memo
(:class:`EvalCache`); the model (:class:`RoutedExpertViT`). Its saved form and the checks of a stored state
are in :mod:`avalanche_color.experts.saved`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, NamedTuple, Optional, Protocol, TypeVar, Union, get_args

import torch
from avalanche.models import MultiTaskModule
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from avalanche_color.config import CANDIDATE_RULES, RoutingOptions
from avalanche_color.experts.saved import check_stored_shapes, from_pretrained, save_pretrained, stored_expert_classes
from avalanche_color.lora import (ExpertSelection, Segments, cached_stacks, pad_dim, source_key, trained_dtype,
                                  with_live_slot)
from avalanche_color.routing.rematching import (Rematched, RematchingRule, energy, first_prediction, pair_logits,
                                                pair_owners)
from avalanche_color.routing.routers import make_router
from avalanche_color.utils.experiences import (experience_classes, experience_task_labels,
                                                  refuse_chunks_without_boundaries)
from avalanche_color.utils.files import PathLike
from avalanche_color.utils.checks import one_of, positive_int, require
from avalanche_color.utils.state import host_value

# --------------------------------------------------------------------------------------------------
# What the frozen backbone must be: a timm VisionTransformer, and images it can take.

def check_vision_transformer(model: nn.Module) -> None:
    """Refuse anything but a timm VisionTransformer, naming what was given and how to get one."""
    if isinstance(model, VisionTransformer):
        return
    given = f"{type(model).__module__}.{type(model).__qualname__}"
    hint = ""
    if type(model).__module__.startswith("torchvision"):
        hint = (" torchvision's ViTs have another layout (no fused per-block qkv layer, no "
                "forward_features/forward_head); build the same architecture with timm, e.g. "
                "timm.create_model('vit_base_patch16_224.augreg_in21k', pretrained=True) for torchvision's vit_b_16.")
    raise TypeError(
        f"model must be a timm.models.vision_transformer.VisionTransformer "
        f"(e.g. timm.create_model('vit_base_patch16_224')), got {given}.{hint}"
    )


def backbone_dtype(vit: VisionTransformer) -> torch.dtype:
    """The floating dtype the ViT computes in: that of its patch embedding's weights."""
    return vit.patch_embed.proj.weight.dtype


def backbone_images(vit: VisionTransformer, x: Tensor) -> Tensor:
    """``x`` in the backbone's dtype, or a ``ValueError`` naming what the patch embedding expects.

    Integer images (uint8 0-255, ...) are refused, not converted: their scale is unknown here,
    and the backbone expects its own normalisation. Floating images of another precision
    (float64 images on a float32 ViT, float32 on a bfloat16 one) are converted: this is the
    one place images enter the backbone.
    """
    if not x.is_floating_point():
        raise ValueError(
            f"images must be a floating-point tensor, normalised as the backbone expects (e.g. "
            f"torchvision's ToTensor then Normalize with the mean and std of "
            f"timm.data.resolve_data_config({{}}, model=vit)), got dtype {x.dtype}"
        )
    embed = vit.patch_embed
    channels = embed.proj.in_channels
    expected = f"(batch, {channels}, {embed.img_size[0]}, {embed.img_size[1]})"
    if x.dim() != 4 or x.shape[1] != channels:
        raise ValueError(f"images must have shape {expected}, got {tuple(x.shape)}")
    size = tuple(x.shape[-2:])
    if getattr(embed, "strict_img_size", True) and size != tuple(embed.img_size):
        raise ValueError(f"images must have shape {expected}, got {tuple(x.shape)}")
    patch = tuple(embed.patch_size)
    if not getattr(embed, "dynamic_img_pad", False) and (size[0] % patch[0] or size[1] % patch[1]):
        raise ValueError(f"image height and width must be multiples of the patch size {patch}, got {size}")
    return x.to(embed.proj.weight.dtype)


def check_experience_images(vit: VisionTransformer, experience: Any) -> None:
    """Refuse a training experience with no samples, or whose first image ``vit`` cannot take
    (:func:`backbone_images`): called before a model changes any state for the experience."""
    if len(experience.dataset) == 0:
        raise ValueError(f"experience {experience.current_experience} has no samples")
    backbone_images(vit, torch.as_tensor(experience.dataset[0][0]).unsqueeze(0))


# --------------------------------------------------------------------------------------------------
# One linear head per expert, over the classes of its experience.

def check_classes(classes: Sequence[int]) -> None:
    """Refuse an empty class list or negative class ids."""
    if len(classes) == 0:
        raise ValueError("classes must name at least one class, got an empty sequence")
    if min(classes) < 0:
        raise ValueError(f"classes must be non-negative class ids, got {sorted(classes)}")


class ExpertHead(nn.Module):
    """A linear head over the classes of one experience.

    ``classes`` maps the head's outputs to the global class ids.
    """

    classes: Tensor

    def __init__(self, in_features: int, classes: Sequence[int]) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, len(classes))
        self.register_buffer("classes", torch.as_tensor(sorted(classes), dtype=torch.long))

    def forward(self, features: Tensor) -> Tensor:
        """Logits in the head's dtype (float32 beside a bfloat16 backbone: its features are cast up)."""
        return self.linear(features.to(self.linear.weight.dtype))


def gathered_head_logits(heads: nn.ModuleList, features: Tensor, experts: Tensor, num_classes: int,
                         trained: Optional[int] = None) -> Tensor:
    """Global-class logits (batch, num_classes) of each sample's expert's head on its ``features``, -inf
    where that head has no class.

    One padded batched matmul for every head at once (fixed shapes, no host sync): the heads are stacked,
    padded to the largest class count, each sample's head gathered by its expert index; padded outputs
    are written to a spare column that is dropped. ``trained``'s head is used live, so gradients reach it.
    """
    weight, bias, columns = stacked_heads(heads, trained)
    features = features.to(weight.dtype)  # a bfloat16 backbone's, up to the heads' float32
    outputs = torch.baddbmm(bias.index_select(0, experts).unsqueeze(2), weight.index_select(0, experts),
                            features.unsqueeze(2)).squeeze(2)
    columns = columns.index_select(0, experts)
    columns = torch.where(columns < 0, num_classes, columns)  # padding -> the spare column
    logits = features.new_full((features.shape[0], num_classes + 1), float("-inf"))
    logits.scatter_(1, columns, outputs.to(logits.dtype))  # under autocast the heads may compute in another dtype
    return logits[:, :num_classes].contiguous()


def stacked_heads(heads: nn.ModuleList, trained: Optional[int] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Every head stacked and padded to the largest class count C: weights (E, C, features), biases (E, C)
    and class ids (E, C), -1 where padded. Cached until a head changes; ``trained``'s slot is live."""
    width = max(len(head.classes) for head in heads)
    frozen = [head for index, head in enumerate(heads) if index != trained]
    live_head = None if trained is None else heads[trained].linear
    live = () if live_head is None else (trained, live_head.weight.dtype, live_head.weight.device)
    key = source_key([t for head in frozen for t in (head.linear.weight, head.linear.bias, head.classes)],
                     len(heads), *live)
    weight, bias, columns = cached_stacks(heads, key, lambda: (
        torch.stack([pad_dim(head.linear.weight, 0, width) for head in heads]),
        torch.stack([pad_dim(head.linear.bias, 0, width) for head in heads]),
        torch.stack([pad_dim(head.classes + 1, 0, width) - 1 for head in heads])))
    if live_head is None:
        return weight, bias, columns
    return (with_live_slot(weight, trained, pad_dim(live_head.weight, 0, width)),
            with_live_slot(bias, trained, pad_dim(live_head.bias, 0, width)), columns)


# --------------------------------------------------------------------------------------------------
# The experts of a routed model, their heads and their records, with an explicit life cycle.
#
# An expert is one module per *slot* (CoLoR: a :class:`~avalanche_color.lora.QVLoRA` in
# every block's qkv layer; S-Prompts: its prompt tokens) plus a linear head. The slots live where the
# model computes with them (inside the backbone, for LoRA), so the bank refers to them without
# owning them; it owns the heads and, per expert, where it comes from (training experience, task
# label) and whether its experience is over.
#
# Life cycle: :meth:`ExpertBank.start_expert` adds an expert, which becomes the one that trains;
# :meth:`ExpertBank.finish_expert` ends it. Which expert trains is set in one place,
# :meth:`ExpertBank.set_trainable`, which also sets ``requires_grad``: nothing reads ``requires_grad``
# back to decide anything (a user's ``model.requires_grad_(True)`` changes no computation).

class ExpertKind(Protocol):
    """What an expert is, for a routed model: the slots its modules go in (one module per slot) and how
    a new one is made, with the expert's settings (CoLoR's rank, S-Prompts' prompt length) held here."""

    slots: Sequence[nn.ModuleList]

    def new_expert_modules(self) -> list[nn.Module]:
        """The modules of one new expert, one per slot, on the slots' device, not yet added."""
        ...


class ExpertBank(nn.Module):
    """Every expert's modules (in ``slots``) and head, its origin, and which expert trains.

    Args:
        slots: the lists to which each expert adds one module, registered where they live.
    """

    experiences: Tensor
    tasks: Tensor
    finished: Tensor

    def __init__(self, slots: Sequence[nn.ModuleList]) -> None:
        super().__init__()
        self.slots = list(slots)  # a plain list: the slots are submodules of the model, not of the bank
        self.heads = nn.ModuleList()
        # Where each expert comes from: its training experience and task label (an experience
        # with several task labels records its smallest).
        self.register_buffer("experiences", torch.empty(0, dtype=torch.long))
        self.register_buffer("tasks", torch.empty(0, dtype=torch.long))
        # Whether each expert's experience is over (its router fitted for good).
        self.register_buffer("finished", torch.empty(0, dtype=torch.bool))
        self.trainable: Optional[int] = None  # the expert that trains: set only by set_trainable

    def __len__(self) -> int:
        return len(self.heads)

    def start_expert(self, modules: Sequence[nn.Module], head: ExpertHead, experience: int = -1,
                     task: int = 0) -> int:
        """Add an expert (one module per slot, and its head); it becomes the one that trains.

        Returns:
            the new expert's index.
        """
        for slot, module in zip(self.slots, modules, strict=True):
            slot.append(module)
        self.heads.append(head)
        new = self.experiences.new_tensor
        self.experiences = torch.cat((self.experiences, new([experience])))
        self.tasks = torch.cat((self.tasks, new([task])))
        self.finished = torch.cat((self.finished, self.finished.new_zeros(1)))
        self.set_trainable(len(self) - 1)
        return len(self) - 1

    def finish_expert(self, expert: int) -> None:
        """End ``expert``'s experience: it never trains again (training on it again adds a further expert)."""
        self.finished[expert] = True
        if self.trainable == expert:
            self.set_trainable(None)

    def set_trainable(self, expert: Optional[int]) -> None:
        """Make ``expert`` the one that trains (None: none does), its parameters the only ones with
        ``requires_grad``; every other expert's parameters are frozen and lose stale gradients."""
        if expert is not None and not 0 <= expert < len(self):
            raise ValueError(f"expert must be None or an index in [0, {len(self)}), got {expert!r}")
        for index in range(len(self)):
            for parameter in self.expert_parameters(index):
                parameter.requires_grad_(index == expert)
                if index != expert:
                    parameter.grad = None
        self.trainable = expert

    @torch.no_grad()
    def copy_expert(self, source: int, target: int) -> bool:
        """Give ``target`` ``source``'s module weights, and its head's where both heads have the same classes
        (returns whether the head was copied); ``source`` itself is unchanged. An expert warm start."""
        for slot in self.slots:
            for copied, original in zip(slot[target].parameters(), slot[source].parameters(), strict=True):
                copied.copy_(original)
        heads = self.heads[target], self.heads[source]
        same_classes = torch.equal(heads[0].classes, heads[1].classes)
        if same_classes:
            heads[0].linear.weight.copy_(heads[1].linear.weight)
            heads[0].linear.bias.copy_(heads[1].linear.bias)
        return same_classes

    def newest_unfinished(self) -> Optional[int]:
        """The newest expert if its experience is not over (the one that trains after loading), else None."""
        newest = len(self) - 1
        return newest if newest >= 0 and not bool(self.finished[newest]) else None

    def current_expert(self, experience: int) -> Optional[int]:
        """The newest expert if it belongs to ``experience`` and is not finished (a run resumed inside it)."""
        newest = self.newest_unfinished()
        return newest if newest is not None and int(self.experiences[newest]) == experience else None

    def expert_modules(self, expert: int) -> Iterator[nn.Module]:
        """The modules that hold ``expert``'s own parameters, its head excluded."""
        for slot in self.slots:
            yield slot[expert]

    def expert_parameters(self, expert: int) -> Iterator[nn.Parameter]:
        """The parameters of one expert: its own modules' and its head's (what its optimiser takes)."""
        for module in self.expert_modules(expert):
            yield from module.parameters()
        yield from self.heads[expert].parameters()

    def check_distinct_task(self, task: int, experience: int) -> None:
        """Oracle routing finds an expert by task label: refuse a label another experience already has."""
        for other_experience, other_task in zip(self.experiences.tolist(), self.tasks.tolist()):
            if other_task == task and other_experience != experience:
                raise ValueError(
                    f"router='oracle' routes by task label, so every experience needs its own: experience "
                    f"{experience} has task label {task}, like experience {other_experience}. Use a "
                    f"task-incremental stream (e.g. task_incremental_benchmark, or nc_benchmark(..., "
                    f"task_labels=True)), or another router (router='prototypes': CoLoR)"
                )


# --------------------------------------------------------------------------------------------------
# Prediction with given experts: one expert for the batch, or one per sample by one of two kernels.
#
# A batch that mixes experts is computed either
#
# * ``"segments"``: sorted by expert, so that each expert acts on a contiguous run of samples (a
#   few matmuls per expert and layer, the fastest on a CPU); the runs' bounds need one host sync;
# * ``"gathered"``: unsorted, each sample's expert factors and head gathered by its index (a fixed
#   number of kernels whatever the number of experts, fixed shapes, no host sync: for GPUs).
#
# ``"auto"`` takes the gathered kernel on CUDA and the segments elsewhere.

# features(x, experts, trained) -> (batch, num_features): a routed model's backbone pass with experts.
Features = Callable[[Tensor, ExpertSelection, Optional[int]], Tensor]
MixedKernel = Literal["auto", "segments", "gathered"]
MIXED_KERNELS: tuple[str, ...] = get_args(MixedKernel)


def check_experts(experts: Union[int, Tensor], batch_size: int, num_experts: int,
                  device: torch.device) -> Union[int, Tensor]:
    """Refuse ``experts`` that are not one index or one per sample of the model's ``num_experts``
    (one host sync for a tensor: its smallest and largest index)."""
    allowed = f"an index in [0, {num_experts}) or a ({batch_size},) integer tensor of them"
    if isinstance(experts, Tensor):
        if experts.shape != (batch_size,) or experts.is_floating_point() or experts.is_complex():
            raise ValueError(f"experts must be {allowed}, got a {experts.dtype} tensor of shape "
                             f"{tuple(experts.shape)}")
        if batch_size:
            low, high = torch.stack((experts.min(), experts.max())).tolist()
            if not (0 <= low and high < num_experts):
                raise ValueError(f"experts must be {allowed}, got indices {sorted(set(experts.tolist()))}")
        return experts.to(device, torch.long)
    if isinstance(experts, bool) or not isinstance(experts, int) or not 0 <= experts < num_experts:
        raise ValueError(f"experts must be {allowed}, got {experts!r}")
    return experts


def check_mixed_kernel(kernel: str) -> None:
    """Refuse a kernel name other than those of :data:`MixedKernel`."""
    if kernel not in MIXED_KERNELS:
        raise ValueError(f"mixed_kernel must be one of {', '.join(map(repr, MIXED_KERNELS))}, got {kernel!r}")


def gathers(kernel: MixedKernel, device: torch.device) -> bool:
    """Whether a mixed batch on ``device`` takes the gathered kernel (``"auto"``: on CUDA)."""
    check_mixed_kernel(kernel)
    return kernel == "gathered" or (kernel == "auto" and device.type == "cuda")


def predict(features: Features, heads: nn.ModuleList, num_classes: int, x: Tensor,
            experts: Union[int, Tensor], trained: Optional[int], kernel: MixedKernel = "segments") -> Tensor:
    """Global-class logits of ``experts`` (one index for the batch, or one per sample) on ``x``: each
    expert's head on its classes, -inf elsewhere.

    ``trained``: the expert that trains (see ``features``). ``kernel``: how a per-sample tensor of
    experts is computed (see the module docstring); ``"gathered"`` needs a ``features`` that takes a
    (batch,) tensor of experts. One index for the batch always takes the single-expert path.
    """
    if isinstance(experts, Tensor) and gathers(kernel, x.device):
        return gathered_head_logits(heads, features(x, experts, trained), experts, num_classes, trained)
    if isinstance(experts, int):
        return _single_expert_logits(features, heads, num_classes, x, experts, trained)
    return _segment_logits(features, heads, num_classes, x, experts, trained)


def _single_expert_logits(features: Features, heads: nn.ModuleList, num_classes: int, x: Tensor, expert: int,
                          trained: Optional[int]) -> Tensor:
    pooled = features(x, expert, trained)
    return _head_logits(heads, pooled, [(expert, slice(None))], num_classes)


def _sorted_runs(experts: Tensor) -> tuple[Tensor, Segments]:
    """The order that sorts a batch by expert, and the runs of the sorted batch. One host sync: the runs'
    experts and bounds."""
    order = experts.argsort(stable=True)
    ids, counts = torch.unique_consecutive(experts[order], return_counts=True)
    layout = torch.cat((ids, counts)).tolist()  # the one host sync
    run_experts, run_lengths = layout[: len(ids)], layout[len(ids) :]
    bounds = [0, *accumulate(run_lengths)]
    return order, [(e, slice(a, b)) for e, a, b in zip(run_experts, bounds, bounds[1:])]


def _segment_logits(features: Features, heads: nn.ModuleList, num_classes: int, x: Tensor, experts: Tensor,
                    trained: Optional[int]) -> Tensor:
    """The batch sorted by expert, each expert on its run of samples, put back in order at the end;
    a batch of one expert takes the single-expert path. One host sync: the runs' experts and bounds."""
    order, segments = _sorted_runs(experts)
    if len(segments) == 1:
        return _single_expert_logits(features, heads, num_classes, x, segments[0][0], trained)
    logits = _head_logits(heads, features(x[order], segments, trained), segments, num_classes)
    unsorted = torch.empty_like(logits)
    unsorted[order] = logits
    return unsorted


def expert_features(features: Features, x: Tensor, experts: Tensor, trained: Optional[int],
                    kernel: MixedKernel = "segments") -> Tensor:
    """The pooled features (batch, num_features) of each sample of ``x`` with its own expert of ``experts``, in
    batch order, by the kernel :func:`predict` takes (a batch of one expert: the single-expert path)."""
    if gathers(kernel, x.device):
        return features(x, experts, trained)
    order, segments = _sorted_runs(experts)
    if len(segments) == 1:
        return features(x, segments[0][0], trained)
    pooled = features(x[order], segments, trained)
    unsorted = torch.empty_like(pooled)
    unsorted[order] = pooled
    return unsorted


def _head_logits(heads: nn.ModuleList, pooled: Tensor, segments: Segments, num_classes: int) -> Tensor:
    """Each expert's head on its run of ``pooled``, written to its classes; -inf elsewhere. The logits are in
    the heads' dtype (float32 beside a bfloat16 backbone, see :func:`~avalanche_color.lora.trained_dtype`)."""
    logits = pooled.new_full((pooled.shape[0], num_classes), float("-inf"), dtype=trained_dtype(pooled.dtype))
    for expert, run in segments:
        head = heads[expert]
        logits[run, head.classes] = head(pooled[run]).to(logits.dtype)  # under autocast the head may differ
    return logits


# --------------------------------------------------------------------------------------------------
# Top-m routing: the router proposes its m best experts per sample, all m run, a rule picks one.
#
# Beyond the paper (``top_m=1``, the default, is the router's own choice and takes none of this). The m
# candidates of a batch run as one mixed batch of m x batch rows (:meth:`RoutedExpertViT.propose`), so
# the cost is one routing pass and m expert passes, whatever the number of experts.

class Candidates(NamedTuple):
    """The experts top-m routing proposes for a batch of B images, best first, and what each computes.

    Attributes:
        experts: (B, m) each sample's candidate experts, in the router's order (column 0: its own choice).
        scores: (B, m) the router's score of each candidate (higher is better, see ``Router.expert_scores``).
        logits: (B, m, classes) each candidate's global-class logits on its sample (-inf outside its classes).
    """

    experts: Tensor
    scores: Tensor
    logits: Tensor

    def pick(self, rule: str) -> tuple[Tensor, Tensor]:
        """The chosen candidate's logits (B, classes) and expert (B,) under ``rule`` (:func:`candidate_merit`);
        a tie goes to the candidate the router ranks first."""
        choice = candidate_merit(self.logits, self.scores, rule).argmax(dim=1, keepdim=True)  # the first maximum
        rows = choice.unsqueeze(2).expand(-1, 1, self.logits.shape[2])
        return self.logits.gather(1, rows).squeeze(1), self.experts.gather(1, choice).squeeze(1)


def candidate_merit(logits: Tensor, scores: Tensor, rule: str) -> Tensor:
    """(B, m) how good each candidate's answer looks, under ``rule`` (CoLoR's ``top_m_rule``):

    * ``"router_product"``: its largest softmax probability (over its head's classes) times the router's
      softmax over the m candidates' ``scores`` (a router that is sure of its choice keeps it);
    * ``"confidence"``: its largest softmax probability alone.

    A third rule, minus the entropy of the softmax, was measured and left out: below ``"confidence"`` on
    every stream it was tried on.
    """
    require("top_m_rule", rule, one_of(CANDIDATE_RULES))
    confidence = logits.softmax(dim=-1).amax(dim=-1)  # -inf outside the head's classes: probability 0
    if rule == "confidence":
        return confidence
    return confidence * scores.to(confidence.dtype).softmax(dim=-1)


def top_candidates(scores: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """The m best experts of each row of ``scores`` (B, experts) and their scores, best first; where a row
    has fewer than m experts the router knows (-inf), its best one fills the rest."""
    best, experts = scores.topk(m, dim=1)
    known = torch.isfinite(best)
    return torch.where(known, experts, experts[:, :1]), torch.where(known, best, best[:, :1])


# --------------------------------------------------------------------------------------------------
# A memo of unchanged evaluation work, reused across repeated evaluations.
#
# Between two evaluations of a continual run, the routing features of a test image
# do not change (the backbone is frozen, and so is the first expert once its
# experience is over), and neither do the outputs of frozen experts. The memo
# keys both by the image's bytes, so it is exact whatever the data pipeline does:
# an image that comes back changed (random eval transforms) is a miss, never a
# wrong answer. The model decides what may be stored (only what a frozen part
# computed); the memo only looks up and stores.
#
# The memo lives in host memory (the model's device keeps its memory for the model), within
# a bound the strategy sets (``cache_evaluation_bytes``). Per batch it costs two host syncs
# whatever the batch size and the number of experts: the images' keys, and the routed experts
# (one ``tolist``); the rows found come back to the device in one copy, the rows computed go to
# the host in one copy.

def image_keys(x: Tensor) -> list[bytes]:
    """One content key per image of the batch.

    On the CPU, a BLAKE2b hash of the image's bytes. On an accelerator the batch is not
    copied to the host: a 128-bit hash is computed on the device (:func:`device_digests`)
    and only those 16 bytes per image are copied. That copy still waits for the device,
    as any key that a Python dict can look up must; it no longer moves the images.
    """
    if x.device.type != "cpu":
        return [row.tobytes() for row in device_digests(x).cpu().numpy()]
    flat = x.detach().contiguous().view(x.shape[0], -1)
    return [hashlib.blake2b(row.numpy().tobytes(), digest_size=16).digest() for row in flat]


_MIX = (0x9E3779B97F4A7C15 - (1 << 64), 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64))


def device_digests(x: Tensor) -> Tensor:
    """(batch, 2) int64: two 64-bit hashes of each image's bytes, computed where ``x`` lives.

    Every 4-byte word is mixed with its position (a splitmix64-style finaliser, so that
    flipping any bit changes about half the bits of its term) and the terms are summed;
    the two hashes use different position offsets.
    """
    raw = x.detach().contiguous().view(x.shape[0], -1)
    if raw.element_size() != 4 or raw.shape[1] * raw.element_size() % 4:
        raw = raw.view(torch.uint8).view(x.shape[0], -1)
        raw = torch.nn.functional.pad(raw, (0, -raw.shape[1] % 4)).view(torch.int32)
    words = raw.view(torch.int32).to(torch.int64)
    positions = torch.arange(words.shape[1], device=x.device, dtype=torch.int64)
    return torch.stack([_mix(words + (positions + 1) * _MIX[0]).sum(1),
                        _mix(words ^ ((positions + 7) * _MIX[2])).sum(1)], dim=1)


def _mix(z: Tensor) -> Tensor:
    z = (z ^ (z >> 30)) * _MIX[1]
    z = (z ^ (z >> 27)) * _MIX[2]
    return z ^ (z >> 31)


class EvalCache:
    """Routing features per image, and frozen experts' logits per (image, expert), within a memory bound.

    Args:
        max_bytes: the most host memory the stored tensors take, half for the routing features and
            half for the logits; past it the oldest entries go first (default 1 GiB: the routing
            features of about 170,000 images of a ViT-B/16).
    """

    def __init__(self, max_bytes: int = 2**30) -> None:
        if not (isinstance(max_bytes, int) and max_bytes > 0):
            raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.features: dict[bytes, Tensor] = {}
        self.logits: dict[tuple[bytes, int], Tensor] = {}
        self._bytes = {"features": 0, "logits": 0}
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        self.features.clear()
        self.logits.clear()
        self._bytes = {"features": 0, "logits": 0}

    def routing_features(self, x: Tensor, keys: list[bytes], compute: Callable[[Tensor], Tensor]) -> Tensor:
        """``compute(x)``, with the rows of images seen before taken from the memo."""
        found = [row for row, key in enumerate(keys) if key in self.features]
        missing = [row for row, key in enumerate(keys) if key not in self.features]
        self._count(len(found), len(keys))
        if not missing:
            return _to_device(torch.stack([self.features[keys[row]] for row in found]), x.device)
        computed = compute(x[_rows(missing, x.device)])
        self._store_rows("features", [keys[row] for row in missing], computed)
        if not found:
            return computed
        features = computed.new_empty((len(keys), *computed.shape[1:]))
        features[_rows(missing, x.device)] = computed
        features[_rows(found, x.device)] = _to_device(torch.stack([self.features[keys[row]] for row in found]),
                                                      x.device).to(computed.dtype)
        return features

    def predict(self, x: Tensor, keys: list[bytes], experts: Tensor, num_classes: int,
                compute: Callable[[Tensor, Tensor], Tensor], is_frozen: Callable[[int], bool]) -> Tensor:
        """``compute(x, experts)`` (global-class logits), reusing the rows of frozen experts seen before."""
        expert_ids = experts.tolist()  # one host sync for the batch, not one per sample
        logits = x.new_full((len(keys), num_classes), float("-inf"))
        found, missing = [], []
        for row, (key, expert) in enumerate(zip(keys, expert_ids)):
            (found if (key, expert) in self.logits else missing).append(row)
        self._count(len(found), len(keys))
        if found:  # stored when fewer classes were known: those columns stay -inf
            stored = [self.logits[(keys[row], expert_ids[row])] for row in found]
            width = max(len(values) for values in stored)
            block = torch.full((len(found), width), float("-inf"), dtype=stored[0].dtype)
            for index, values in enumerate(stored):
                block[index, : len(values)] = values
            logits[_rows(found, x.device), :width] = _to_device(block, x.device).to(logits.dtype)
        if missing:
            rows = _rows(missing, x.device)
            logits[rows] = computed = compute(x[rows], experts[rows])
            frozen = [index for index, row in enumerate(missing) if is_frozen(expert_ids[row])]
            if frozen:
                self._store_rows("logits", [(keys[missing[i]], expert_ids[missing[i]]) for i in frozen],
                                 computed[_rows(frozen, computed.device)])
        return logits

    def _store_rows(self, memo_name: str, keys: list[Any], values: Tensor) -> None:
        """Keep each row of ``values`` under its key, in host memory (one copy from the device for all rows)."""
        for key, row in zip(keys, values.detach().to("cpu")):  # _store gives each row its own memory
            self._store(memo_name, key, row)

    def _store(self, memo_name: str, key: Any, values: Tensor) -> None:
        """Keep ``values`` under ``key``; the oldest entries of that memo go while it is over its half."""
        memo: dict[Any, Tensor] = getattr(self, memo_name)
        if key in memo:
            self._bytes[memo_name] -= _size(memo.pop(key))
        memo[key] = values = values.clone()  # its own (host) memory: a row view would keep its whole batch
        self._bytes[memo_name] += _size(values)
        while self._bytes[memo_name] > self.max_bytes // 2 and len(memo) > 1:
            self._bytes[memo_name] -= _size(memo.pop(next(iter(memo))))

    def _count(self, hits: int, total: int) -> None:
        self.hits += hits
        self.misses += total - hits


def _size(values: Tensor) -> int:
    return values.numel() * values.element_size()


def _rows(rows: list[int], device: torch.device) -> Tensor:
    return torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True)


def _to_device(values: Tensor, device: torch.device) -> Tensor:
    """Host rows to ``device`` in one copy (page-locked first on CUDA, so the copy does not block the host)."""
    if device.type == "cuda":
        values = values.pin_memory()
    return values.to(device, non_blocking=device.type == "cuda")


# --------------------------------------------------------------------------------------------------
# The model.

Model = TypeVar("Model", bound="RoutedExpertViT")


class RoutedExpertViT(MultiTaskModule):
    """Base of the routed expert models: a frozen ViT, an expert bank, a router.

    ``model(x, task_labels=None, experts=None)`` gives global-class logits (classes the chosen
    expert does not know get ``-inf``). Which experts compute them:

    * ``experts`` given (an index, or one per sample): those, in either mode;
    * no expert yet: zeros (Avalanche evaluates once before the first training step);
    * train mode: the expert that trains, for every sample (a ``RuntimeError`` once every expert
      is finished: call ``model.eval()``);
    * eval mode: each sample's routed expert (with ``top_m`` > 1: the candidate the rule picks among the
      router's m best, see :meth:`propose`; with ``rematching``: the expert HRM-PET's re-matching settles
      on, see :meth:`rematch`).

    ``return_experts=True`` returns ``(logits, experts)``: the experts that computed each sample (None
    while there is no expert, and in train mode, where the expert that trains computes every sample).
    The package's strategies and the drop-in plugin evaluate through it, so the routing-accuracy metric
    reads the experts as the strategy's ``mb_routed_experts``, beside its ``mb_output``.

    Subclasses give ``__init__`` their :class:`ExpertKind` (the slots and
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
    # How a batch that mixes experts is computed (see predict): "gathered" and "auto" (gathered on
    # CUDA) need a features() that takes one expert per sample as a tensor; set it to force a kernel.
    mixed_kernel: MixedKernel = "segments"
    # (number of heads, one past their largest class id) as Python ints: read from the heads' class tensors
    # once per change (an expert added, a state loaded), not in every forward (a host sync on a GPU).
    _head_classes: Optional[tuple[int, int]] = None

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
        self.register_load_state_dict_post_hook(RoutedExpertViT._after_loading)

    def new_expert_modules(self) -> list[nn.Module]:
        """The modules of one new expert, one per slot, not yet added (made by the model's expert kind)."""
        return self.expert_kind.new_expert_modules()

    def features(self, x: Tensor, experts: ExpertSelection = None, trained: Optional[int] = None) -> Tensor:
        """The pooled features (batch, num_features) with ``experts``: None, one index, or ``Segments``
        (:data:`~avalanche_color.lora.Segments`) of a batch sorted by expert. ``trained``: the expert
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
        """Avalanche's hook, called before training on an experience and before evaluating one: the model
        records the classes it has seen (its output width) and, for a training experience (in train mode),
        starts a new expert, or continues the unfinished one of the same experience.

        Training on an experience again (a revisit) adds a further expert; only an unfinished
        expert of the same experience (a run resumed inside it, or the next chunk of an online
        stream with task boundaries) is continued. With ``router="oracle"`` an experience must
        have one task label, which no other experience has.
        """
        classes, tasks = experience_classes(experience), experience_task_labels(experience)
        if classes:  # MultiTaskModule's bookkeeping, for experiences of any generator
            self.max_class_label = max(self.max_class_label, classes[-1] + 1)
        if not self.training:
            return
        refuse_chunks_without_boundaries(experience, type(self).__name__)
        self.known_train_tasks_labels = self.known_train_tasks_labels | set(tasks)
        experience_id = int(experience.current_experience)
        if self.bank.current_expert(experience_id) is not None:
            return
        # Refuse unusable data before the expert exists, not at the first forward.
        check_experience_images(self.backbone, experience)
        if not self.router.uses_features:
            if len(tasks) != 1:
                raise ValueError(f"router='oracle' routes by task label, so experience {experience_id} must "
                                 f"have one task label, got {tasks}")
            self.bank.check_distinct_task(tasks[0], experience_id)
        self.start_expert(classes, experience_id, tasks[0])

    def forward(self, x: Tensor, task_labels: Optional[Tensor] = None, experts: Union[int, Tensor, None] = None,
                return_experts: bool = False) -> Union[Tensor, tuple[Tensor, Optional[Tensor]]]:
        """Global-class logits of images ``x`` (batch, channels, height, width): pick the experts (see the class
        docstring), then :func:`predict`. ``task_labels``: one per sample, for the oracle; ``experts``: an
        index, or one per sample; ``return_experts``: ``(logits, the routed experts)`` (None where nothing
        was routed: experts given, train mode, no expert yet)."""
        routed = None
        if experts is not None:
            experts = check_experts(experts, x.shape[0], self.num_experts, self.device)
            logits = self.predict(x, experts)
        elif not self.num_experts:
            logits = x.new_zeros(x.shape[0], self.num_classes)
        elif self.training:
            logits = self.predict(x, self.training_expert())
        elif self.eval_cache is not None or self.top_m > 1 or self.rematching is not None:
            logits, routed = self.route_and_predict(x, task_labels)
        else:
            routed = self.route(x, task_labels)
            logits = self.predict(x, routed)
        return (logits, routed) if return_experts else logits

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
        computed by ``mixed_kernel``, see the function :func:`predict`)."""
        return predict(self.features, self.bank.heads, self.num_classes, x, experts, self.bank.trainable,
                       self.mixed_kernel)

    # How the model picks each sample's expert: routing features, the router, the evaluation cache.
    def routing_features(self, x: Tensor) -> Tensor:
        """The features the router is fitted on and routes by: the backbone's, or with the first expert."""
        if self.config.routing_features == "first_expert":
            if not self.num_experts:
                raise RuntimeError("routing_features='first_expert' needs a trained first expert")
            features = self.features(x, 0, trained=self.bank.trainable)
        else:
            features = self.features(x)
        return nn.functional.normalize(features, dim=-1) if self.config.normalize_features else features

    def routing_features_frozen(self) -> bool:
        """Whether routing features stay the same for the rest of the run."""
        return self.config.routing_features == "backbone" or bool(self.num_experts and self.bank.finished[0])

    def route(self, x: Tensor, task_labels: Optional[Tensor] = None, keys: Optional[list[bytes]] = None) -> Tensor:
        """The expert index of each sample, chosen by the router (with ``top_m`` > 1, the first of the
        candidates :meth:`propose` gives). ``keys`` (the images' content hashes) let the evaluation cache
        supply routing features it computed before, while they are frozen."""
        if task_labels is not None:
            task_labels = torch.as_tensor(task_labels, device=x.device).expand(x.shape[0])
        return self.router(self._router_features(x, keys), task_labels, self.bank.tasks)

    def _router_features(self, x: Tensor, keys: Optional[list[bytes]]) -> Optional[Tensor]:
        """The routing features the router reads (None for the oracle), from the evaluation cache where it may."""
        if not self.router.uses_features:
            return None
        if keys is not None and self.eval_cache is not None and self.routing_features_frozen():
            return self.eval_cache.routing_features(x, keys, self.routing_features)
        return self.routing_features(x)

    @property
    def top_m(self) -> int:
        """How many experts the router proposes per sample at evaluation (:meth:`propose`); 1: its own
        choice. CoLoR's ``top_m`` option (:class:`~avalanche_color.ExpertViT`)."""
        return 1

    @property
    def top_m_rule(self) -> str:
        """How one of the ``top_m`` candidates is picked (:func:`candidate_merit`)."""
        return "router_product"

    @property
    def rematching(self) -> Optional[RematchingRule]:
        """HRM-PET's re-matching at evaluation (:meth:`rematch`), or None: the router's choice. CoLoR's
        ``rematching`` options (:class:`~avalanche_color.ExpertViT`)."""
        return None

    def rematch(self, x: Tensor, keys: Optional[list[bytes]] = None, rule: Optional[RematchingRule] = None) -> Rematched:
        """HRM-PET's re-matching of images ``x`` under ``rule`` (default :attr:`rematching`; see
        :mod:`avalanche_color.routing.rematching`): the router's expert, every expert's head on that expert's
        features (the first prediction, over (expert, class) pairs), then a second pass for the samples the
        direct step moves and one for the low-confidence samples' candidates. ``keys``: as in :meth:`route`
        (the evaluation cache supplies routing features only)."""
        rule = self.rematching if rule is None else rule
        if rule is None:
            raise ValueError("rematch needs a rule: give rule=RematchingRule(...), or build the model with "
                             "rematching='hybrid', 'direct' or 'confidence'")
        if not self.router.uses_features:
            raise ValueError("rematching moves samples away from the oracle's expert, the right one: use "
                             "router='prototypes', 'ridge' or 'gaussian'")
        routing = self._router_features(x, keys)
        first = self.router(routing, None, self.bank.tasks)
        trained = self.bank.trainable
        weight, bias, columns = stacked_heads(self.bank.heads, trained)

        def run(images: Tensor, experts: Tensor) -> tuple[Tensor, Tensor]:
            pooled = expert_features(self.features, images, experts, trained, self.mixed_kernel)
            return pooled, pair_logits(weight, bias, columns, pooled)

        pooled, pairs = run(x, first)
        answer, moved = first.clone(), torch.zeros_like(first, dtype=torch.bool)
        low = torch.zeros_like(moved)
        if self.num_experts > 1:  # one expert: nothing to re-match (HRM-PET's confidence step needs task_id > 0)
            seen = first_prediction(pairs, pair_owners(columns, self.num_classes), rule)
            if rule.direct:
                moved = (seen.best >= 0) & (seen.best != first)
                rows = moved.nonzero().flatten()
                if rows.numel():
                    pooled, pairs = pooled.clone(), pairs.clone()
                    answer[rows] = seen.best[rows]
                    pooled[rows], pairs[rows] = run(x[rows], seen.best[rows])
            if rule.confidence:
                candidates = seen.second if rule.candidate == "class" else top_candidates(
                    self.router.expert_scores(routing, self.num_experts), 2)[0][:, 1]
                low = seen.low_confidence & (candidates >= 0)  # a class of several experts names no candidate
                rows = low.nonzero().flatten()
                if rows.numel():
                    other, other_pairs = run(x[rows], candidates[rows])
                    better = energy(other_pairs) > energy(pairs[rows])  # a tie keeps the answer (HRM-PET's max)
                    taken = rows[better]
                    pooled = pooled.clone()
                    answer[taken] = candidates[taken]
                    pooled[taken] = other[better]
        logits = gathered_head_logits(self.bank.heads, pooled, answer, self.num_classes, trained)
        return Rematched(logits, answer, first, moved, low)

    def propose(self, x: Tensor, m: Optional[int] = None, keys: Optional[list[bytes]] = None) -> Candidates:
        """Top-m routing's candidates for images ``x``: the router's ``m`` best experts per sample (default
        :attr:`top_m`; at most the number of experts) and each one's logits on its sample, computed as one
        mixed batch of m x batch rows after one routing pass. ``keys``: as in :meth:`route`, and the evaluation
        cache supplies finished experts' logits it computed before."""
        require("m", self.top_m if m is None else m, positive_int)
        m = min(self.top_m if m is None else m, self.num_experts)
        experts, scores = top_candidates(self.router.expert_scores(self._router_features(x, keys), self.num_experts), m)
        rows = experts.T.reshape(-1)  # candidate-major: row j * batch + i is sample i's j-th candidate
        images = x.repeat(m, *([1] * (x.dim() - 1)))
        logits = self.predict(images, rows) if keys is None else self._cached_predict(images, keys * m, rows)
        return Candidates(experts, scores, logits.view(m, x.shape[0], -1).transpose(0, 1))

    def _cached_predict(self, x: Tensor, keys: list[bytes], experts: Tensor) -> Tensor:
        """:meth:`predict` of ``experts``, through the evaluation cache (finished experts' rows seen before reused)."""
        if self.eval_cache is None:
            return self.predict(x, experts)
        finished = host_value(self.bank, "finished", self.bank.finished, lambda tensor: tensor.tolist())
        return self.eval_cache.predict(x, keys, experts, self.num_classes, self.predict,
                                       lambda expert: finished[expert])

    def route_and_predict(self, x: Tensor, task_labels: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        """The routed prediction of an eval-mode ``model(x)``, in either mode: the logits and each sample's
        expert (None while there is no expert). With ``cache_evaluation=True``, routing features and finished
        experts' logits of images seen before are reused: the same values, computed without gradients. With
        ``top_m`` > 1, the expert :meth:`propose`'s candidates and ``top_m_rule`` pick; with ``rematching``,
        the one :meth:`rematch` settles on."""
        if not self.num_experts:
            return x.new_zeros(x.shape[0], self.num_classes), None
        if self.rematching is not None:
            if self.eval_cache is None:
                rematched = self.rematch(x)
            else:
                with torch.no_grad():
                    rematched = self.rematch(x, image_keys(x))
            return rematched.logits, rematched.experts
        if self.eval_cache is None:
            if self.top_m > 1:
                return self.propose(x).pick(self.top_m_rule)
            experts = self.route(x, task_labels)
            return self.predict(x, experts), experts
        with torch.no_grad():
            keys = image_keys(x)
            if self.top_m > 1:
                return self.propose(x, keys=keys).pick(self.top_m_rule)
            experts = self.route(x, task_labels, keys)
            return self._cached_predict(x, keys, experts), experts

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
        (:mod:`avalanche_color.experts.saved`; :meth:`from_pretrained` loads it)."""
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
