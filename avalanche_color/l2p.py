"""Learning to Prompt (L2P, Wang et al., CVPR 2022) on any timm ViT, as an Avalanche strategy.

The project's own implementation of the paper, not Avalanche's ``LearningToPrompt``:
that one builds its ViT from a fixed list of 224 px model names, hard-codes
768-wide heads, keeps a second full ViT for the queries and fails with timm 1.x.
Here the user's ViT is used as it is (width, depth, image size and prefix
tokens read from the model), and the query is the same frozen ViT run
without prompts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Callable, Literal, Optional, Union, get_args

import torch
from avalanche.core import BasePlugin
from avalanche.models import DynamicModule
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.plugins.evaluation import default_evaluator
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color.experts import check_images, check_vision_transformer
from avalanche_color.expert_strategy import expert_model
from avalanche_color.prompt_pool import PROMPT_INITS, PromptInit, PromptPool
from avalanche_color.prompts import drop_prompts, prompt_outputs, prompt_width, prompted_tokens
from avalanche_color.validation import check_choice, check_positive, check_positive_int

HeadInput = Literal["prompts", "pooled"]
HEAD_INPUTS: tuple[str, ...] = get_args(HeadInput)


class GrowingHead(nn.Module):
    """A linear layer whose outputs (classes) grow; new rows start as ``nn.Linear``'s, old rows stay."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(0, in_features))
        self.bias = nn.Parameter(torch.empty(0))

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
        bound = self.in_features ** -0.5
        new_weight = self.weight.new_empty(extra, self.in_features).uniform_(-bound, bound)
        new_bias = self.bias.new_empty(extra).uniform_(-bound, bound)
        self.weight = nn.Parameter(torch.cat((self.weight.detach(), new_weight)))
        self.bias = nn.Parameter(torch.cat((self.bias.detach(), new_bias)))

    def forward(self, features: Tensor) -> Tensor:
        return nn.functional.linear(features, self.weight, self.bias)


class L2PViT(DynamicModule):
    """A frozen timm ViT with an L2P prompt pool and one linear head over all classes seen.

    Per sample: the query is the frozen ViT's pooled ([CLS]) feature; the
    ``top_n`` prompts whose keys match it best (cosine) are inserted behind the
    [CLS] token; the head reads the average of the outputs at the prompt
    positions (L2P's default) or the pooled feature. The pool and head are
    shared by all experiences. The head grows with the classes of each
    training experience; classes never trained get ``-inf``, and in training
    with ``class_masking`` so do the classes outside the current experience.

    Args:
        vit: a timm ``VisionTransformer``; it is frozen, not changed.
        pool_size: M, prompts in the pool (L2P: 10).
        prompt_length: L_p, tokens per prompt (L2P: 5).
        top_n: N, prompts chosen per sample (L2P: 5); at most ``pool_size``.
        head_input: ``"prompts"`` (mean of the prompt positions' outputs, L2P)
            or ``"pooled"`` (the ViT's own pooled feature with prompts in the sequence).
        class_masking: in training, mask the logits of classes outside the
            current experience (L2P's class-incremental training).
        prompt_init: ``"uniform"`` in [-1, 1] (L2P's default) or ``"zero"``.
    """

    trained_classes: Tensor
    current_classes: Tensor

    def __init__(
        self,
        vit: nn.Module,
        *,
        pool_size: int = 10,
        prompt_length: int = 5,
        top_n: int = 5,
        head_input: HeadInput = "prompts",
        class_masking: bool = True,
        prompt_init: PromptInit = "uniform",
    ) -> None:
        super().__init__()
        check_vision_transformer(vit)
        check_positive_int("pool_size", pool_size)
        check_positive_int("prompt_length", prompt_length)
        check_positive_int("top_n", top_n)
        if top_n > pool_size:
            raise ValueError(f"top_n must be at most pool_size={pool_size}, got top_n={top_n}")
        check_choice("head_input", head_input, HEAD_INPUTS)
        check_choice("prompt_init", prompt_init, PROMPT_INITS)
        self.top_n = top_n
        self.head_input: HeadInput = head_input
        self.class_masking = class_masking
        self.backbone = vit.requires_grad_(False).eval()
        device = vit.patch_embed.proj.weight.device
        self.pool = PromptPool(pool_size, prompt_length, prompt_width(vit), int(vit.num_features),
                               prompt_init).to(device)
        head_width = prompt_width(vit) if head_input == "prompts" else int(vit.num_features)
        self.head = GrowingHead(head_width).to(device)  # grows with the classes trained
        self.register_buffer("trained_classes", torch.zeros(0, dtype=torch.bool, device=device))
        self.register_buffer("current_classes", torch.zeros(0, dtype=torch.bool, device=device))
        self.max_class_label = 0  # one past the largest class id of any adapted experience
        self.last_query: Optional[Tensor] = None
        self.last_selection: Optional[Tensor] = None

    @property
    def num_classes(self) -> int:
        """Width of the output: the head's, or more if an adapted experience has larger class ids."""
        return max(self.head.out_features, self.max_class_label)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """What L2P trains: the pool's keys and prompts and the head, all shared across experiences."""
        yield from self.pool.parameters()
        yield from self.head.parameters()

    # ------------------------------------------------------------------ classes

    def adaptation(self, experience: Any) -> None:
        """Avalanche's hook before each experience: in training, learn its classes."""
        super().adaptation(experience)
        classes = [int(c) for c in experience.classes_in_this_experience]
        if not classes:
            return
        self.max_class_label = max(self.max_class_label, max(classes) + 1)
        if not self.training:
            return
        if len(experience.dataset) == 0:
            raise ValueError(f"experience {experience.current_experience} has no samples")
        check_images(self.backbone, torch.as_tensor(experience.dataset[0][0]).unsqueeze(0))
        self.learn_classes(classes)

    def learn_classes(self, classes: Sequence[int]) -> None:
        """Make ``classes`` the ones being trained, growing the head if they are new."""
        if min(classes) < 0:
            raise ValueError(f"classes must be non-negative class ids, got {sorted(classes)}")
        self._grow(max(classes) + 1)
        self.current_classes = torch.zeros_like(self.trained_classes)
        self.current_classes[list(classes)] = True
        self.trained_classes = self.trained_classes | self.current_classes

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
        if self.head_input == "prompts":
            return prompt_outputs(tokens, count, prefix).mean(dim=1)
        return self.backbone.forward_head(drop_prompts(tokens, count, prefix), pre_logits=True)

    def forward(self, x: Tensor) -> Tensor:
        """Global-class logits; the query and the chosen prompts stay in ``last_query``/``last_selection``."""
        if not bool(self.trained_classes.any()):
            raise RuntimeError("the model has no trained class yet: train on an experience before evaluating")
        check_images(self.backbone, x)
        query = self.query(x)
        selection = self.pool.select(query, self.top_n)
        self.last_query, self.last_selection = query, selection
        logits = self.head(self.features(x, selection))
        allowed = self.current_classes if self.training and self.class_masking else self.trained_classes
        logits = logits.masked_fill(~allowed, float("-inf"))
        missing = self.num_classes - logits.shape[1]  # classes of adapted experiences never trained
        return nn.functional.pad(logits, (0, missing), value=float("-inf")) if missing else logits

    def train(self, mode: bool = True) -> "L2PViT":
        super().train(mode)
        self.backbone.eval()  # frozen parts never see dropout or drop-path noise
        return self

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # The head's width grows with the stream: take the stored one.
        stored = state_dict.get(prefix + "head.weight")
        if stored is not None:
            self._grow(stored.shape[0])
        for name in ("trained_classes", "current_classes"):
            if prefix + name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[prefix + name], device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args)


class L2P(SupervisedTemplate):
    """Learning to Prompt (Wang et al., CVPR 2022) with a frozen timm ViT of any size.

    A pool of ``pool_size`` prompts with keys is shared by all experiences;
    each sample uses the ``top_n`` prompts whose keys best match its frozen
    [CLS] feature; a surrogate loss pulls the chosen keys towards the queries;
    in class-incremental streams the logits of classes outside the current
    experience are masked in training. Adam over pool and head, restarted per
    experience.

    Defaults are the L2P paper's: M=10 prompts of L_p=5 tokens, N=5 chosen,
    Adam (betas 0.9, 0.999) with constant lr 0.03, batch 128, 5 epochs
    (Split CIFAR-100); the surrogate weight 0.1 is the L2P code's
    ``pull_constraint_coeff``.

    Args:
        model: a timm ``VisionTransformer`` (frozen, not changed), or an
            :class:`L2PViT` to continue from (then the pool and head options
            must stay unset).
        pool_size: M (default 10).
        prompt_length: L_p (default 5).
        top_n: N (default 5).
        head_input: ``"prompts"`` (default) or ``"pooled"``, see :class:`L2PViT`.
        class_masking: mask logits outside the current experience in training (default True).
        prompt_init: ``"uniform"`` (default) or ``"zero"``, see :class:`PromptPool`.
        surrogate_weight: lambda, the weight of the key-query surrogate loss.
        lr: Adam's learning rate.
        criterion: loss; a new ``CrossEntropyLoss`` by default.
        train_mb_size, train_epochs, eval_mb_size, device, plugins, evaluator,
        eval_every: as in Avalanche's ``SupervisedTemplate``; ``plugins`` is
            copied, never changed.
    """

    model: L2PViT

    def __init__(
        self,
        model: nn.Module,
        *,
        pool_size: Optional[int] = None,
        prompt_length: Optional[int] = None,
        top_n: Optional[int] = None,
        head_input: Optional[HeadInput] = None,
        class_masking: Optional[bool] = None,
        prompt_init: Optional[PromptInit] = None,
        surrogate_weight: float = 0.1,
        lr: float = 0.03,
        criterion: Optional[nn.Module] = None,
        train_mb_size: int = 128,
        train_epochs: int = 5,
        eval_mb_size: int = 128,
        device: Union[str, torch.device] = "cpu",
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = default_evaluator,
        eval_every: int = -1,
        **base_kwargs: Any,
    ) -> None:
        l2p_model = expert_model(model, L2PViT, pool_size=pool_size, prompt_length=prompt_length,
                                 top_n=top_n, head_input=head_input, class_masking=class_masking,
                                 prompt_init=prompt_init)
        check_positive("lr", lr)
        if isinstance(surrogate_weight, bool) or not isinstance(surrogate_weight, (int, float)) \
                or surrogate_weight < 0:
            raise ValueError(f"surrogate_weight must be a number >= 0, got {surrogate_weight!r}")
        for name, value in (("train_mb_size", train_mb_size), ("train_epochs", train_epochs),
                            ("eval_mb_size", eval_mb_size)):
            check_positive_int(name, value)
        self.lr = lr
        self.surrogate_weight = surrogate_weight
        self._classification_loss = nn.CrossEntropyLoss() if criterion is None else criterion
        super().__init__(
            model=l2p_model,
            # Replaced by make_optimizer before each experience, once the head covers its classes.
            optimizer=torch.optim.Adam(l2p_model.pool.parameters(), lr=lr),
            criterion=self._classification_loss,
            train_mb_size=train_mb_size,
            train_epochs=train_epochs,
            eval_mb_size=eval_mb_size,
            device=device,
            plugins=list(plugins or ()),
            evaluator=evaluator,
            eval_every=eval_every,
            **base_kwargs,
        )

    def check_model_and_optimizer(self, **kwargs: Any) -> None:
        # The head grows in the model adaptation, so the optimiser comes after it.
        self.model = self.model_adaptation()
        self.make_optimizer(**kwargs)

    def make_optimizer(self, **kwargs: Any) -> None:
        """A fresh Adam over the pool and the head (state reset per experience, as L2P's code)."""
        self.optimizer = torch.optim.Adam(list(self.model.trainable_parameters()), lr=self.lr,
                                          betas=(0.9, 0.999))

    def criterion(self) -> Tensor:
        """Classification loss, plus in training the surrogate loss pulling the chosen keys to the queries."""
        loss = self._classification_loss(self.mb_output, self.mb_y)
        if self.is_training and self.surrogate_weight:
            loss = loss + self.surrogate_weight * self.model.pool.surrogate_loss(
                self.model.last_query, self.model.last_selection)
        return loss

    def eval(self, exp_list: Any, **kwargs: Any) -> Any:
        if not bool(self.model.trained_classes.any()):
            raise RuntimeError("L2P has no trained class yet: call train() on an experience before eval()")
        return super().eval(exp_list, **kwargs)


# As for CoLoR: the model is the one positional argument, so skip Avalanche's positional-argument wrapper.
L2P.__init__ = L2P.__init__.__wrapped__  # type: ignore[attr-defined]
