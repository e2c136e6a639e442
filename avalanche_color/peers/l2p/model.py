"""L2P's model: a frozen timm ViT, a shared prompt pool with keys (:class:`PromptPool`: prompts chosen per
sample, or per batch, by how well the keys match a query), and one growing head.

Any timm ViT as it is (width, depth, image size and prefix tokens read from the
model); the query is the same frozen ViT run without prompts. Why this is not
Avalanche's ``LearningToPrompt``: see :mod:`avalanche_color.peers.l2p.strategy`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Optional

import torch
from avalanche.models import DynamicModule
from torch import Tensor, nn

from avalanche_color.experts.routed_vit import (backbone_dtype, backbone_images, check_experience_images,
                                                check_vision_transformer)
from avalanche_color.lora import trained_dtype
from avalanche_color.peers.l2p.config import PROMPT_INITS, L2PModelOptions, PromptInit
from avalanche_color.peers.prompts import drop_prompts, new_prompts, prompt_outputs, prompt_width, prompted_tokens
from avalanche_color.utils.checks import one_of, require
from avalanche_color.utils.experiences import experience_classes
from avalanche_color.utils.state import host_value, keep_host_value, take_stored_shapes


class PromptPool(nn.Module):
    """M prompts of ``prompt_length`` tokens, each with a key of the query's width.

    A sample's query (the frozen ViT's [CLS] feature) picks the ``top_n``
    prompts whose keys are most cosine-similar to it; the surrogate loss pulls
    the chosen keys towards their queries (L2P, Wang et al., CVPR 2022, Eq. 5).
    Keys start uniform in [-1, 1], as in Avalanche's port (L2P's code: [0, 0.01)).

    Args:
        pool_size: M, the number of prompts.
        prompt_length: L_p, tokens per prompt.
        width: token width of the ViT (prompts) and width of its queries (keys).
        key_width: width of the queries, if it differs from ``width``.
        prompt_init: prompts start ``"uniform"`` in [-1, 1] (Avalanche's port's default) or at
            ``"zero"`` (the port's other option; the prompt outputs then start as
            image-driven as the [CLS] output, which helps small, untrained ViTs); ``"code"``:
            prompts and keys in [0, 0.01), L2P's code's flax ``uniform()``.
    """

    def __init__(self, pool_size: int, prompt_length: int, width: int, key_width: int | None = None,
                 prompt_init: PromptInit = "uniform") -> None:
        super().__init__()
        require("prompt_init", prompt_init, one_of(PROMPT_INITS))
        if prompt_init == "code":  # flax's uniform(): [0, 0.01), prompts and keys alike
            self.prompts = nn.Parameter(torch.empty(pool_size, prompt_length, width).uniform_(0.0, 0.01))
            self.keys = nn.Parameter(torch.empty(pool_size, key_width or width).uniform_(0.0, 0.01))
            return
        bound = 1.0 if prompt_init == "uniform" else 0.0
        self.prompts = nn.Parameter(torch.empty(pool_size, prompt_length, width).uniform_(-bound, bound))
        self.keys = new_prompts(pool_size, key_width or width, 1.0)

    @property
    def pool_size(self) -> int:
        return self.prompts.shape[0]

    @property
    def prompt_length(self) -> int:
        return self.prompts.shape[1]

    def similarity(self, query: Tensor) -> Tensor:
        """(batch, M) cosine similarity of each query (batch, width) to each key, in the keys' dtype (a bfloat16
        backbone's query is cast up to float32 keys)."""
        query = query.to(self.keys.dtype)
        return nn.functional.normalize(query, dim=-1) @ nn.functional.normalize(self.keys, dim=-1).T

    def select(self, query: Tensor, top_n: int, *, batchwise: bool = False) -> Tensor:
        """(batch, top_n) indices of the best-matching keys per query, best first; with ``batchwise``,
        the batch's :func:`majority_selection` for every sample."""
        selection = self.similarity(query.detach()).topk(top_n, dim=1).indices
        return majority_selection(selection, self.pool_size) if batchwise else selection

    def selected_prompts(self, selection: Tensor) -> Tensor:
        """(batch, top_n * prompt_length, width): the selected prompts, concatenated in selection order."""
        return self.prompts[selection].flatten(1, 2)

    def surrogate_loss(self, query: Tensor, selection: Tensor) -> Tensor:
        """Cosine distance of each query to its selected keys, summed over keys, averaged over the batch.

        Only the keys receive its gradient (the query comes from the frozen backbone).
        """
        chosen = self.similarity(query.detach()).gather(1, selection)
        return (1 - chosen).sum(dim=1).mean()


def majority_selection(selection: Tensor, pool_size: int) -> Tensor:
    """The ``top_n`` prompts a batch's samples chose most often, for every sample of the batch.

    L2P's code's ``batchwise_prompt`` (``models/prompt.py``, ``Prompt.__call__``): ``jnp.unique``
    counts the ids in the batch's (batch, top_n) ``selection`` and ``jax.lax.top_k`` takes the
    ``top_n`` largest counts, the lower id first among equal counts.

    Args:
        selection: (batch, top_n) prompt indices chosen per sample.
        pool_size: the number of prompts in the pool.

    Returns:
        (batch, top_n): the same ``top_n`` indices in every row, the most often chosen first.
    """
    counts = torch.bincount(selection.flatten(), minlength=pool_size)
    majority = counts.sort(descending=True, stable=True).indices[: selection.shape[1]]
    return majority.unsqueeze(0).expand(selection.shape[0], -1)


class GrowingHead(nn.Module):
    """A linear layer whose outputs (classes) grow; new rows start as ``nn.Linear``'s (``zero``: at zero, as
    L2P's code's head), old rows stay."""

    def __init__(self, in_features: int, zero: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(0, in_features))
        self.bias = nn.Parameter(torch.empty(0))
        self.zero = zero

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def grow(self, out_features: int) -> None:
        """Widen to ``out_features`` outputs (never shrinks)."""
        extra = out_features - self.out_features
        if extra <= 0:
            return
        bound = 0.0 if self.zero else self.in_features ** -0.5
        new_weight = self.weight.new_empty(extra, self.in_features).uniform_(-bound, bound)
        new_bias = self.bias.new_empty(extra).uniform_(-bound, bound)
        self.weight = nn.Parameter(torch.cat((self.weight.detach(), new_weight)))
        self.bias = nn.Parameter(torch.cat((self.bias.detach(), new_bias)))

    def forward(self, features: Tensor) -> Tensor:
        """Logits in the head's dtype (float32 beside a bfloat16 backbone: its features are cast up)."""
        return nn.functional.linear(features.to(self.weight.dtype), self.weight, self.bias)


class L2PViT(DynamicModule):
    """A frozen timm ViT with an L2P prompt pool and one linear head over all classes seen.

    Per sample: the query is the frozen ViT's pooled ([CLS]) feature; the
    ``top_n`` prompts whose keys match it best (cosine) are inserted behind the
    [CLS] token (with ``batchwise_selection``, the batch's most frequent ones for
    every sample); the head reads the average of the outputs at the prompt
    positions (L2P's default) or the pooled feature. The pool and head are
    shared by all experiences. The head grows with the classes of each
    training experience; classes never trained get ``-inf`` (``head_init="zero"``:
    0), and in training with ``class_masking`` the classes outside the current
    experience get ``-inf``.

    Args:
        vit: a timm ``VisionTransformer``; it is frozen, not changed.
        config: :class:`~avalanche_color.config.L2PModelOptions` (or an
            :class:`~avalanche_color.config.L2PConfig`); keyword options
            (``pool_size``, ``prompt_length``, ``top_n``, ``head_input``,
            ``class_masking``, ``prompt_init``, ``head_init``, ``batchwise_selection``) replace its
            fields.
    """

    trained_classes: Tensor
    current_classes: Tensor
    config: L2PModelOptions

    def __init__(self, vit: nn.Module, config: Optional[L2PModelOptions] = None, /, **options: Any) -> None:
        super().__init__()
        check_vision_transformer(vit)
        self.config = config = L2PModelOptions.build(config, **options)
        self.backbone = vit.requires_grad_(False).eval()
        device, dtype = vit.patch_embed.proj.weight.device, trained_dtype(backbone_dtype(vit))
        # The pool and the head are float32 beside a bfloat16 backbone (trained_dtype), in its dtype beside a float64
        # one: the prompts are cast to the tokens' dtype where inserted, the queries and features up to the keys'
        # and the head's, so the logits are float32.
        self.pool = PromptPool(config.pool_size, config.prompt_length, prompt_width(vit), int(vit.num_features),
                               config.prompt_init).to(device, dtype)
        head_width = prompt_width(vit) if config.head_input == "prompts" else int(vit.num_features)
        self.head = GrowingHead(head_width, zero=config.head_init == "zero").to(device, dtype)  # grows with the classes
        self.register_buffer("trained_classes", torch.zeros(0, dtype=torch.bool, device=device))
        self.register_buffer("current_classes", torch.zeros(0, dtype=torch.bool, device=device))
        self.max_class_label = 0  # one past the largest class id of any adapted experience

    @property
    def num_classes(self) -> int:
        """Width of the output: the head's, or more if an adapted experience has larger class ids."""
        return max(self.head.out_features, self.max_class_label)

    @property
    def num_experts(self) -> int:
        """0: L2P adds no expert per experience (its pool and head are shared), so the strategy prepares none."""
        return 0

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """What L2P trains: the pool's keys and prompts and the head, all shared across experiences."""
        yield from self.pool.parameters()
        yield from self.head.parameters()

    def experience_parameter_count(self, experience: int, num_classes: Optional[int] = None) -> int:
        """What an experience trains: everything L2P trains (the pool and the head over the classes seen so
        far), shared by every experience; nothing is added per experience but head rows."""
        return sum(p.numel() for p in self.trainable_parameters())

    # ------------------------------------------------------------------ classes

    def adaptation(self, experience: Any) -> None:
        """Avalanche's hook before each experience: in training, learn its classes."""
        super().adaptation(experience)
        classes = experience_classes(experience)
        if not classes:
            return
        self.max_class_label = max(self.max_class_label, max(classes) + 1)
        if not self.training:
            return
        check_experience_images(self.backbone, experience)
        self.learn_classes(classes)

    def learn_classes(self, classes: Sequence[int]) -> None:
        """Make ``classes`` the ones being trained, growing the head if they are new."""
        if min(classes) < 0:
            raise ValueError(f"classes must be non-negative class ids, got {sorted(classes)}")
        self._grow(max(classes) + 1)
        self.current_classes = torch.zeros_like(self.trained_classes)
        self.current_classes[list(classes)] = True
        self.trained_classes = self.trained_classes | self.current_classes
        keep_host_value(self, "trained", self.trained_classes, True)  # classes is not empty

    def _grow(self, num_classes: int) -> None:
        if num_classes <= self.head.out_features:
            return
        self.head.grow(num_classes)
        grown = self.trained_classes.new_zeros(num_classes)
        grown[: len(self.trained_classes)] = self.trained_classes
        self.trained_classes = grown
        self.current_classes = torch.zeros_like(grown)

    # ------------------------------------------------------------------ forward

    def query(self, x: Tensor) -> Tensor:
        """The frozen ViT's pooled ([CLS]) feature without prompts: what keys are matched to."""
        with torch.no_grad():
            return self.backbone.forward_head(self.backbone.forward_features(x), pre_logits=True)

    def features(self, x: Tensor, selection: Tensor) -> Tensor:
        """The head's input with the ``selection`` (batch, top_n) of pool prompts per sample."""
        prompts = self.pool.selected_prompts(selection)
        tokens = prompted_tokens(self.backbone, x, prompts)
        count, prefix = prompts.shape[1], self.backbone.num_prefix_tokens
        if self.config.head_input == "prompts":
            return prompt_outputs(tokens, count, prefix).mean(dim=1)
        return self.backbone.forward_head(drop_prompts(tokens, count, prefix), pre_logits=True)

    @property
    def selects_batchwise(self) -> bool:
        """Whether :meth:`select_prompts` gives the whole batch the same prompts now: with
        ``batchwise_selection="always"``, or ``"training"`` while the model is in training mode."""
        mode = self.config.batchwise_selection
        return mode == "always" or mode == "training" and self.training

    def select_prompts(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Each sample's query (:meth:`query`) and the (batch, top_n) pool prompts whose keys match it
        best, or, when :attr:`selects_batchwise`, those the batch's samples chose most often, for all
        (:func:`majority_selection`)."""
        x = backbone_images(self.backbone, x)
        query = self.query(x)
        return query, self.pool.select(query, self.config.top_n, batchwise=self.selects_batchwise)

    def forward(self, x: Tensor, selection: Optional[Tensor] = None) -> Tensor:
        """Global-class logits with ``selection``, (batch, top_n) pool prompt indices, or, when None,
        those each sample selects (:meth:`select_prompts`)."""
        if not host_value(self, "trained", self.trained_classes, lambda trained: bool(trained.any())):
            # Nothing learned yet (Avalanche evaluates once before the first training step): like an
            # untrained model, no preference among the classes. (Read on the host once per change of
            # trained_classes, not in every forward: a host sync on a GPU.)
            return x.new_zeros(x.shape[0], self.num_classes)
        x = backbone_images(self.backbone, x)
        if selection is None:
            selection = self.select_prompts(x)[1]
        logits = self.head(self.features(x, selection))
        if self.training and self.config.class_masking:
            allowed, untrained = self.current_classes, float("-inf")
        else:  # head_init="zero": a class never trained scores 0, its row in the code's fixed head
            allowed, untrained = self.trained_classes, 0.0 if self.config.head_init == "zero" else float("-inf")
        logits = logits.masked_fill(~allowed, untrained)
        missing = self.num_classes - logits.shape[1]  # classes of adapted experiences never trained
        return nn.functional.pad(logits, (0, missing), value=untrained) if missing else logits

    def train(self, mode: bool = True) -> "L2PViT":
        super().train(mode)
        self.backbone.eval()  # frozen parts never see dropout or drop-path noise
        return self

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # The head's width grows with the stream: take the stored one.
        stored = state_dict.get(prefix + "head.weight")
        if stored is not None:
            self._grow(stored.shape[0])
        take_stored_shapes(self, state_dict, prefix, ("trained_classes", "current_classes"))
        super()._load_from_state_dict(state_dict, prefix, *args)
