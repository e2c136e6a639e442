"""The option groups every method shares, declared once, each with its default and its check.

The options are frozen dataclasses, grouped by the part of the method they set:

* :class:`RoutingOptions`: how samples reach an expert (routing features, router).
* :class:`PrototypeOptions`: the k-means prototypes fitted after each experience.
* :class:`LoaderOptions`: how data is loaded (DataLoader worker processes, pinned memory).
* :class:`TrainingOptions`: the learning rate, the budget (Avalanche's mini-batch
  sizes, epochs and periodic evaluation) and the numeric precision (``precision``, Lightning's
  names); :class:`ExpertTrainingOptions` adds SGD's
  settings and the data checks of the routed-expert strategies.
* :class:`RoutedExpertsConfig`: all of them, what CoLoR and S-Prompts share.

Each method keeps its own options in its folder, as peft keeps ``tuners/<method>/config.py``:
its model's options and its whole config (``color/config.py``: ``LoRAOptions``, ``CoLoRConfig``;
``peers/s_prompts/config.py``; ``peers/l2p/config.py``). A strategy lists every field of its
config as a keyword argument with the same default (a test checks they agree), builds the
config once, and hands each part its own group (:meth:`Options.group`): the model its model
options, the prototype fitting its :class:`PrototypeOptions`, the loaders their
:class:`LoaderOptions`.

A bad value raises a ``ValueError`` naming the option, the value and what is allowed.
Configs take keywords only (``CoLoRConfig(8)`` is a ``TypeError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from avalanche_color.utils.checks import (Options, boolean, integer, non_negative, non_negative_int, one_of, option,
                                          optional, positive, positive_int)

RoutingFeatures = Literal["backbone", "first_expert"]
Router = Literal["prototypes", "ridge", "gaussian", "oracle"]
Distance = Literal["euclidean", "l1", "cosine"]
PrototypeData = Literal["train", "eval"]
# Lightning's names: float32 throughout; the forward and the loss under bfloat16 or float16 autocast
# (trained weights stay float32; float16 with a gradient scaler).
Precision = Literal["32-true", "bf16-mixed", "16-mixed"]

ROUTING_FEATURES: tuple[str, ...] = RoutingFeatures.__args__  # type: ignore[attr-defined]
ROUTERS: tuple[str, ...] = Router.__args__  # type: ignore[attr-defined]
DISTANCES: tuple[str, ...] = Distance.__args__  # type: ignore[attr-defined]
PROTOTYPE_DATA: tuple[str, ...] = PrototypeData.__args__  # type: ignore[attr-defined]
PRECISIONS: tuple[str, ...] = Precision.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True, kw_only=True)
class RoutingOptions(Options):
    """How each test sample reaches an expert: where its routing features come from, and what picks.

    Attributes:
        routing_features: where the features that prototypes are made of and samples are
            routed by come from: ``"backbone"``, the frozen ViT (CoLoR, S-Prompts), or
            ``"first_expert"``, the ViT with the first expert (CoLoR++).
        router: what picks each sample's expert. ``"prototypes"``: the nearest k-means
            prototype of those features (the paper). ``"oracle"``: the expert trained on the
            sample's task label (task-incremental streams; no features needed). Beyond the
            paper, off by default, class-level routers that predict each sample's (expert, class)
            pair from statistics of every experience's features and labels
            (:mod:`avalanche_color.routing.routers`): ``"ridge"`` (RanPAC's closed-form ridge
            over random ReLU features) or ``"gaussian"`` (per-pair means, one shared covariance:
            HiDe's Gaussians, in closed form).
        router_width: the ridge router's random features M; its statistics hold M² float64
            numbers (2048: 32 MiB), whatever the number of classes and experiences.
        distance: between features and prototypes: ``"euclidean"``, ``"l1"`` or ``"cosine"``.
        normalize_features: L2-normalise features before clustering and routing.
        cache_evaluation: reuse routing features and frozen experts' outputs across
            evaluations (exact; pays off when the same test stream is evaluated
            after every experience with deterministic transforms).
        cache_evaluation_bytes: the most host memory that cache takes (half for routing features,
            half for logits; the oldest entries go first). 1 GiB holds the routing features of
            about 170,000 images of a ViT-B/16.
    """

    routing_features: RoutingFeatures = option("backbone", one_of(ROUTING_FEATURES), expert_setting=True)
    router: Router = option("prototypes", one_of(ROUTERS), expert_setting=True)
    router_width: int = option(2048, positive_int, expert_setting=True)
    distance: Distance = option("euclidean", one_of(DISTANCES), expert_setting=True)
    normalize_features: bool = option(True, boolean, expert_setting=True)
    cache_evaluation: bool = option(False, boolean)
    cache_evaluation_bytes: int = option(2**30, positive_int)


@dataclass(frozen=True, kw_only=True)
class PrototypeOptions(Options):
    """The prototypes fitted after each experience.

    Attributes:
        k: prototypes per experience (the paper: 5 domain-, 20 class-incremental).
        kmeans_seed: k-means ``random_state``.
        kmeans_n_init: k-means restarts (explicit: scikit-learn's default changed in 1.4).
        prototype_data: embed the experience with its ``"train"`` transforms (as the
            loader gives it, S-Prompts' choice) or its ``"eval"`` transforms.
        prototype_batch_size: batch size of the embedding pass; None: the eval mini-batch size.
        prototypes_per_class: beyond the paper, off by default: fit this many k-means
            centres within each class of the experience (at most the class's sample count),
            from the training labels CoLoR already has, instead of ``k`` centres over the
            whole experience; every class then owns prototypes near its own samples.
    """

    k: int = option(5, positive_int)
    kmeans_seed: int = option(0, integer)
    kmeans_n_init: int = option(10, positive_int)
    prototype_data: PrototypeData = option("train", one_of(PROTOTYPE_DATA))
    prototype_batch_size: Optional[int] = option(None, optional(positive_int))
    prototypes_per_class: Optional[int] = option(None, optional(positive_int))


@dataclass(frozen=True, kw_only=True)
class LoaderOptions(Options):
    """How every loader of a strategy (training, prototype fitting, data scan, evaluation) loads data.

    The names and meanings are those of ``torch.utils.data.DataLoader`` and of Avalanche's
    ``strategy.train(experience, num_workers=...)``; keywords given to ``train`` or ``eval``
    replace these for that call.

    Attributes:
        num_workers: worker processes that load and transform batches while the model computes
            (0: in the training process). With random transforms, the worker count changes
            which random draws each sample gets, as in PyTorch.
        pin_memory: page-locked batches for faster copies to a GPU; None: when the device is CUDA.
        persistent_workers: keep the workers between epochs (needs ``num_workers`` >= 1).
    """

    num_workers: int = option(0, non_negative_int)
    pin_memory: Optional[bool] = option(None, optional(boolean))
    persistent_workers: bool = option(False, boolean)

    def _check_together(self) -> None:
        super()._check_together()
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers=True keeps worker processes, so it needs num_workers >= 1, "
                             "got num_workers=0")

    def loader_options(self) -> dict[str, Any]:
        """These options as keywords of Avalanche's ``train``/``eval`` and of a ``DataLoader``."""
        return {name: getattr(self, name) for name in LoaderOptions.names()}


@dataclass(frozen=True, kw_only=True)
class TrainingOptions(Options):
    """The learning rate, the budget and the numeric precision.

    Attributes:
        lr: learning rate.
        train_mb_size, train_epochs, eval_mb_size, eval_every: as in Avalanche's
            ``SupervisedTemplate``.
        precision: Lightning's names. ``"32-true"``: float32 throughout. ``"bf16-mixed"``: each
            training and evaluation forward and its loss run under ``torch.autocast(bfloat16)``; the
            trained weights (experts, heads, prompts, magnitudes) and their updates stay float32,
            and the routers, k-means and the closed-form solvers compute in float32/float64.
            ``"16-mixed"``: the same with float16, and a gradient scaler
            (:class:`~avalanche_color.training.strategy.MixedPrecision`). Not an expert setting: a model trained
            under one precision loads and continues under another.
        check_data: scan each training experience for bad samples (non-finite pixels, labels that are
            not class ids) before the model changes for it; empty experiences, non-finite evaluation
            pixels and a non-finite loss are refused either way (:mod:`avalanche_color.training.data_checks`).
    """

    lr: float = option(1e-3, positive)
    train_mb_size: int = option(128, positive_int)
    train_epochs: int = option(50, positive_int)
    eval_mb_size: int = option(128, positive_int)
    eval_every: int = option(-1, integer)
    precision: Precision = option("32-true", one_of(PRECISIONS))
    check_data: bool = option(True, boolean)


@dataclass(frozen=True, kw_only=True)
class ExpertTrainingOptions(TrainingOptions):
    """How each expert is trained: SGD with a cosine schedule restarting per experience.

    Attributes:
        momentum, weight_decay: SGD's.
    """

    momentum: float = option(0.9, non_negative)
    weight_decay: float = option(2e-4, non_negative)


@dataclass(frozen=True, kw_only=True)
class RoutedExpertsConfig(LoaderOptions, RoutingOptions, PrototypeOptions, ExpertTrainingOptions):
    """What every routed-expert method (CoLoR, S-Prompts) sets besides its experts: routing,
    prototypes, SGD training and loaders. A method's config adds its expert's options
    (:class:`~avalanche_color.color.config.CoLoRConfig`,
    :class:`~avalanche_color.peers.s_prompts.config.SPromptsConfig`)."""
