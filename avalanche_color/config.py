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
``peers/s_prompts/config.py``; ``peers/l2p/config.py``). Each option is declared once, as a field
(:func:`~avalanche_color.utils.checks.option`: its default, its check and its doc); the groups'
Attributes and the docs' options table are made from those fields, and each strategy's ``__init__``,
written in its file, names each default (``rank: int = CoLoRConfig.rank``: the field's
:class:`~avalanche_color.utils.checks.OptionDefault`, shown as ``64``). A strategy builds its config once,
from the keywords given (:class:`~avalanche_color.training.strategy.StrategyBase`), and hands each part
its own group (:meth:`Options.group`): the model its model options, the prototype fitting its
:class:`PrototypeOptions`, the loaders their :class:`LoaderOptions`.

A bad value raises a ``ValueError`` naming the option, the value and what is allowed.
Configs take keywords only (``CoLoRConfig(8)`` is a ``TypeError``).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, get_args

from avalanche_color.utils.checks import (Options, boolean, integer, non_negative, non_negative_int, one_of, option,
                                          option_group, optional, positive, positive_int)

# How top-m routing picks one of the m experts the router proposes (:func:`~avalanche_color.experts.routed_vit.pick_candidates`):
# here, below the model that checks it and the CoLoR config that declares the option.
CandidateRule = Literal["router_product", "confidence"]
CANDIDATE_RULES: tuple[str, ...] = get_args(CandidateRule)

# HRM-PET's re-matching (:mod:`avalanche_color.routing.rematching`): which of its two steps run, how a first
# prediction's confidence is scored, and where the confidence step's second candidate comes from; here, below
# the rule that checks them and the CoLoR config that declares the options.
Rematching = Literal["off", "hybrid", "direct", "confidence"]
ConfidenceScore = Literal["gen", "msp"]
RematchingCandidate = Literal["class", "router"]
REMATCHING: tuple[str, ...] = get_args(Rematching)
CONFIDENCE_SCORES: tuple[str, ...] = get_args(ConfidenceScore)
REMATCHING_CANDIDATES: tuple[str, ...] = get_args(RematchingCandidate)

RoutingFeatures = Literal["backbone", "first_expert"]
Router = Literal["prototypes", "ridge", "gaussian", "oracle"]
Distance = Literal["euclidean", "l1", "cosine"]
PrototypeData = Literal["train", "eval"]
# Lightning's names: float32 throughout; the forward and the loss under bfloat16 or float16 autocast
# (trained weights stay float32; float16 with a gradient scaler).
Precision = Literal["32-true", "bf16-mixed", "16-mixed"]

ROUTING_FEATURES: tuple[str, ...] = get_args(RoutingFeatures)
ROUTERS: tuple[str, ...] = get_args(Router)
DISTANCES: tuple[str, ...] = get_args(Distance)
PROTOTYPE_DATA: tuple[str, ...] = get_args(PrototypeData)
PRECISIONS: tuple[str, ...] = get_args(Precision)


@option_group
class RoutingOptions(Options):
    """How each test sample reaches an expert: where its routing features come from, and what picks."""

    routing_features: RoutingFeatures = option(
        "backbone", one_of(ROUTING_FEATURES), expert_setting=True,
        doc='where the features that prototypes are made of and samples are routed by come from: ``"backbone"``, '
            'the frozen ViT (CoLoR, S-Prompts), or ``"first_expert"``, the ViT with the first expert (CoLoR++).')
    router: Router = option(
        "prototypes", one_of(ROUTERS), expert_setting=True,
        doc='what picks each sample\'s expert. ``"prototypes"``: the nearest k-means prototype of its routing '
            'features (the paper). ``"oracle"``: the expert trained on the sample\'s task label (the '
            'task-incremental upper bound; needs distinct task labels, no features). Beyond the paper, '
            'class-level routers that predict each sample\'s (expert, class) pair from statistics of every '
            'experience\'s features and labels (:mod:`avalanche_color.routing.routers`): ``"ridge"`` (RanPAC\'s '
            'closed-form ridge over random ReLU features) or ``"gaussian"`` (per-pair means, one shared '
            'covariance: HiDe\'s Gaussians, in closed form).')
    router_width: int = option(
        2048, positive_int, expert_setting=True,
        doc="the ridge router's random features M; its statistics hold M² float64 numbers (2048: 32 MiB), "
            "whatever the number of classes and experiences.")
    distance: Distance = option(
        "euclidean", one_of(DISTANCES), expert_setting=True,
        doc='between features and prototypes: ``"euclidean"`` (CoLoR\'s authors\' code), ``"l1"`` (S-Prompts\' '
            'code) or ``"cosine"``.')
    normalize_features: bool = option(
        True, boolean, expert_setting=True,
        doc="L2-normalise the routing features before k-means, the prototype distances and the class routers "
            "(the paper's choice; the centres are not normalised again); False: cluster and route the raw "
            "features.")
    cache_evaluation: bool = option(
        False, boolean,
        doc="reuse routing features and frozen experts' outputs across evaluations (exact; pays off when the "
            "same test stream is evaluated after every experience with deterministic transforms).")
    cache_evaluation_bytes: int = option(
        2**30, positive_int,
        doc="the most host memory that cache takes, half for routing features, half for logits; the oldest "
            "entries go first. 1 GiB holds the routing features of about 170,000 images of a ViT-B/16.")


@option_group
class PrototypeOptions(Options):
    """The prototypes fitted after each experience."""

    k: int = option(
        5, positive_int,
        doc="prototypes per experience (the paper: 5 domain-incremental; class-incremental twice the new "
            "classes, 20 on Split CIFAR-100).")
    kmeans_seed: int = option(0, integer, doc="k-means ``random_state`` (scikit-learn's ``KMeans``).")
    kmeans_n_init: int = option(
        10, positive_int, doc="k-means restarts, ``n_init`` (explicit: scikit-learn's default changed in 1.4).")
    prototype_data: PrototypeData = option(
        "train", one_of(PROTOTYPE_DATA),
        doc='embed the experience with its ``"train"`` transforms (as the loader gives it, S-Prompts\' choice) '
            'or its ``"eval"`` transforms; the pass is seeded with ``kmeans_seed`` and leaves the run\'s random '
            'generators as they were.')
    prototype_batch_size: Optional[int] = option(
        None, optional(positive_int),
        doc="batch size of the pass that embeds an experience for its prototypes and the class routers' "
            "statistics; None: ``eval_mb_size``. Lower it when that pass runs out of memory.")
    prototypes_per_class: Optional[int] = option(
        None, optional(positive_int),
        doc="beyond the paper: fit this many k-means centres within each class of the experience (at most the "
            "class's sample count), from its training labels, instead of ``k`` over the whole experience, so "
            "that every class owns prototypes near its own samples; None: off.")


@option_group
class LoaderOptions(Options):
    """How every loader of a strategy (training, prototype fitting, data scan, evaluation) loads data.

    The names and meanings are those of ``torch.utils.data.DataLoader`` and of Avalanche's
    ``strategy.train(experience, num_workers=...)``; keywords given to ``train`` or ``eval``
    replace these for that call.
    """

    num_workers: int = option(
        0, non_negative_int,
        doc="DataLoader worker processes of every loader, which load and transform batches while the model "
            "computes; 0: in the training process. With random transforms, the worker count changes which "
            "random draws each sample gets, as in PyTorch.")
    pin_memory: Optional[bool] = option(
        None, optional(boolean), doc="page-locked batches, for faster copies to a GPU; None: when the device is CUDA.")
    persistent_workers: bool = option(
        False, boolean, doc="keep the workers between epochs (needs ``num_workers`` >= 1).")

    def _check_together(self) -> None:
        super()._check_together()
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers=True keeps worker processes, so it needs num_workers >= 1, "
                             "got num_workers=0")

    def loader_options(self) -> dict[str, Any]:
        """These options as keywords of Avalanche's ``train``/``eval`` and of a ``DataLoader``."""
        return {name: getattr(self, name) for name in LoaderOptions.names()}


@option_group
class PrecisionOptions(Options):
    """The numeric precision of training and evaluation (every training strategy's, Joint-LoRA's too)."""

    precision: Precision = option(
        "32-true", one_of(PRECISIONS),
        doc='Lightning\'s names. ``"32-true"``: float32 throughout. ``"bf16-mixed"``: each training and '
            'evaluation forward and its loss run under ``torch.autocast(bfloat16)``; the trained weights '
            '(experts, heads, prompts, magnitudes) and their updates stay float32, and the routers, k-means and '
            'the closed-form solvers compute in float32/float64. ``"16-mixed"``: the same with float16, and a '
            'gradient scaler (:class:`~avalanche_color.training.strategy.MixedPrecision`). A ViT given in '
            'bfloat16 stays so (half its memory) and computes in bfloat16 under ``"32-true"`` too, the trained '
            'weights float32 beside it. Not an expert setting: a model trained under one precision loads and '
            'continues under another.')


@option_group
class TrainingOptions(PrecisionOptions):
    """The learning rate, the budget and the numeric precision."""

    lr: float = option(
        1e-3, positive,
        doc="learning rate of the optimiser made for each experience (CoLoR: SGD, cosine-annealed over the "
            "experience's steps).")
    train_mb_size: int = option(128, positive_int, doc="training mini-batch size.")
    train_epochs: int = option(50, positive_int, doc="epochs per experience.")
    eval_mb_size: int = option(128, positive_int, doc="evaluation mini-batch size.")
    eval_every: int = option(
        -1, integer,
        doc='Avalanche\'s periodic evaluation during training: every that many epochs (or iterations, with '
            '``peval_mode="iteration"``); 0: at the end of each experience only; -1: never.')
    check_data: bool = option(
        True, boolean,
        doc="scan each training experience for bad samples (non-finite pixels, labels that are not class ids) "
            "before the model changes for it; empty experiences, non-finite evaluation pixels and a non-finite "
            "loss are refused either way (:mod:`avalanche_color.training.data_checks`).")


@option_group
class ExpertTrainingOptions(TrainingOptions):
    """How each expert is trained: SGD with a cosine schedule restarting per experience."""

    momentum: float = option(0.9, non_negative, doc="SGD's momentum.")
    weight_decay: float = option(2e-4, non_negative, doc="SGD's weight decay.")


@option_group
class RoutedExpertsConfig(RoutingOptions, PrototypeOptions, ExpertTrainingOptions, LoaderOptions):
    """What every routed-expert method (CoLoR, S-Prompts) sets besides its experts: routing,
    prototypes, SGD training and loaders. A method's config adds its expert's options
    (:class:`~avalanche_color.color.config.CoLoRConfig`,
    :class:`~avalanche_color.peers.s_prompts.config.SPromptsConfig`)."""
