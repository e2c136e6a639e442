"""The compared methods, each built on the same pretrained backbone with the same budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics
from avalanche.logging import BaseLogger
from avalanche.models import IncrementalClassifier, NCMClassifier, TrainEvalModel
from avalanche.models.utils import FeatureExtractorModel
from avalanche.training import EWC, JointTraining, LwF, Naive, Replay
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.templates import SupervisedTemplate
from torch import Tensor, nn

from avalanche_color import L2P, CoLoR, CoLoRConfig, ExpertViT, RoutedExpertViT, SPrompts, routing_accuracy_metrics
from avalanche_color.training.cosine_schedule import PerExperienceCosine
from avalanche_color.utils.experiences import experience_classes
from benchmarks.compare.embedding import experience_features
from benchmarks.compare.ranpac import RanPACModel, RidgeUpdate

# CoLoR's routing options per method name; "CoLoR-oracle" needs a stream with task label = experience.
# The "-ridge" and "-gaussian" variants route with a class-level router (beyond the paper, see
# avalanche_color.routing.class_router); their experts train exactly as CoLoR's.
COLOR_ROUTING: dict[str, dict[str, str]] = {
    "CoLoR": dict(routing="backbone"),
    "CoLoR++": dict(routing="first_expert"),
    "CoLoR-oracle": dict(routing="oracle"),
    "CoLoR-ridge": dict(routing="backbone", router="ridge"),
    "CoLoR-gaussian": dict(routing="backbone", router="gaussian"),
    "CoLoR++-ridge": dict(routing="first_expert", router="ridge"),
}
# The prompt-tuning peers of the paper: S-Prompts routes like CoLoR (k prototypes), L2P picks prompts from a pool.
PROMPT_METHODS = ("S-Prompts", "L2P")
# Methods with a prototype router: they take k and report routing accuracy.
PROTOTYPE_ROUTED = (*COLOR_ROUTING, "S-Prompts")
# Methods that train a few parameters on a frozen backbone: cheap, so the runner gives them every seed.
FROZEN_BACKBONE = (*COLOR_ROUTING, *PROMPT_METHODS)
# Upper bounds, trained once on all experiences together (Avalanche's JointTraining): the whole
# ViT fine-tuned, and one CoLoR expert (rank-r LoRA on q and v, a head over every class).
JOINT = ("Joint-FT", "Joint-LoRA")
# Methods with LoRA experts: they take a rank.
LORA_METHODS = (*COLOR_ROUTING, "Joint-LoRA")
# "FT-masked" is the paper's "FT + class masking"; "NCM" the nearest class mean of the frozen
# backbone's features (SimpleCIL) and "RanPAC" its closed-form ridge over random ReLU features,
# both training nothing.
TRAINING_FREE = ("NCM", "RanPAC")
BASELINES = ("Naive", "FT-masked", "EWC", "LwF", "Replay", *TRAINING_FREE, *JOINT)
METHODS = (*COLOR_ROUTING, *PROMPT_METHODS, *BASELINES)


@dataclass(frozen=True)
class Budget:
    """What every method gets: epochs and batch size per experience, and a device (the DataLoader
    workers reach every method through its ``train``/``eval`` calls, see ``run.py``)."""

    epochs: int = 5
    batch_size: int = 32
    device: str = "cpu"


@dataclass(frozen=True)
class Hyperparameters:
    """Per-method settings (the baselines fine-tune the whole ViT, so they take a smaller lr).

    S-Prompts trains with CoLoR's optimiser and lr (SGD, cosine), so the two differ only in
    the expert; L2P with its paper's Adam and lr; both with their papers' prompt sizes.
    Joint-LoRA trains its expert as CoLoR does (``color_lr``, SGD, cosine), Joint-FT and
    FT-masked as the other fine-tuning baselines (``baseline_lr``, SGD). ``weight_decay`` goes to
    every SGD optimiser; None leaves each method its own (CoLoR, S-Prompts: 2e-4; fine-tuning: 0).
    """

    color_lr: float = 0.05
    color_rank: int = 16
    color_k: int = 10
    s_prompts_length: int = 10
    l2p_lr: float = 0.03
    l2p_pool_size: int = 10
    l2p_prompt_length: int = 5
    l2p_top_n: int = 5
    baseline_lr: float = 0.01
    ewc_lambda: float = 100.0
    lwf_alpha: float = 1.0
    lwf_temperature: float = 2.0
    replay_memory: int = 200
    weight_decay: Optional[float] = None
    prototypes_per_class: Optional[int] = None  # CoLoR and S-Prompts: k-means per class (off: None)
    ridge_width: int = 2048  # random features M of RanPAC and of the ridge routers (CoLoR-ridge, CoLoR++-ridge)


def needs_task_labels(method: str) -> bool:
    return COLOR_ROUTING.get(method, {}).get("routing") == "oracle"


def evaluator(loggers: Sequence[BaseLogger] = ()) -> EvaluationPlugin:
    return EvaluationPlugin(
        accuracy_metrics(experience=True, stream=True),
        forgetting_metrics(experience=True, stream=True),
        *routing_accuracy_metrics(),
        loggers=list(loggers),
    )


def build_strategy(
    method: str,
    backbone: Callable[[int], nn.Module],
    num_classes: int,
    budget: Budget,
    hp: Hyperparameters,
    loggers: Optional[Sequence[BaseLogger]] = None,
) -> SupervisedTemplate:
    """A strategy for ``method``; ``backbone(num_classes)`` gives a fresh pretrained ViT
    (``backbone(0)``: without a classifier, its output the pooled features)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    common = dict(train_mb_size=budget.batch_size, train_epochs=budget.epochs,
                  eval_mb_size=256, device=budget.device, evaluator=evaluator(loggers or ()))
    decay = {} if hp.weight_decay is None else {"weight_decay": hp.weight_decay}
    prototypes = dict(k=hp.color_k, prototypes_per_class=hp.prototypes_per_class)
    if method in COLOR_ROUTING:
        ridge = {"router_width": hp.ridge_width} if COLOR_ROUTING[method].get("router") == "ridge" else {}
        return CoLoR(backbone(0), rank=hp.color_rank, lr=hp.color_lr, **COLOR_ROUTING[method],
                     **prototypes, **ridge, **decay, **common)
    if method == "S-Prompts":
        return SPrompts(backbone(0), prompt_length=hp.s_prompts_length, lr=hp.color_lr, **prototypes, **decay,
                        **common)
    if method == "L2P":
        return L2P(backbone(0), pool_size=hp.l2p_pool_size, prompt_length=hp.l2p_prompt_length,
                   top_n=hp.l2p_top_n, lr=hp.l2p_lr, **common)
    if method == "NCM":
        vit, ncm = backbone(0).requires_grad_(False), SeenClassesNCM(normalize=True)
        # No forward in training: the NCM is both classifiers.
        return TrainingFree(model=TrainEvalModel(vit, train_classifier=ncm, eval_classifier=ncm),
                            optimizer=torch.optim.SGD(vit.parameters(), lr=hp.baseline_lr),
                            criterion=nn.CrossEntropyLoss(), plugins=[ClassMeanUpdate()], **common)
    if method == "RanPAC":
        model = RanPACModel(backbone(0), num_classes, hp.ridge_width)
        return TrainingFree(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=hp.baseline_lr),
                            criterion=nn.CrossEntropyLoss(), plugins=[RidgeUpdate()], **common)
    if method == "Joint-LoRA":
        model = SingleLoRAExpert(backbone(0), hp.color_rank, range(num_classes))
        color = CoLoRConfig()  # CoLoR's momentum and weight decay
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=hp.color_lr,
                                    momentum=color.momentum, weight_decay=decay.get("weight_decay", color.weight_decay))
        return JointExpertTraining(model=model, optimizer=optimizer, criterion=nn.CrossEntropyLoss(), **common)
    if method == "FT-masked":
        vit = backbone(0)
        head = IncrementalClassifier(vit.num_features, num_classes, masking=True, mask_value=float("-inf"))
        model: nn.Module = FeatureExtractorModel(vit, head)
        plugins: list[SupervisedPlugin] = [CurrentClassesMasking(head)]
    else:
        model, plugins = backbone(num_classes), []
    baseline: dict[str, Any] = dict(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=hp.baseline_lr, momentum=0.9,
                                               weight_decay=hp.weight_decay or 0.0),
        criterion=nn.CrossEntropyLoss(), plugins=plugins, **common)
    if method in ("Naive", "FT-masked"):
        return Naive(**baseline)
    if method == "Joint-FT":
        return JointTraining(**baseline)
    if method == "EWC":
        return EWC(ewc_lambda=hp.ewc_lambda, **baseline)
    if method == "LwF":
        return LwF(alpha=hp.lwf_alpha, temperature=hp.lwf_temperature, **baseline)
    return Replay(mem_size=hp.replay_memory, **baseline)


def trainable_parameters_per_experience(strategy: SupervisedTemplate) -> int:
    """What one experience trains.

    CoLoR and S-Prompts: one expert (LoRA + head, or prompt tokens + head; the first
    experience's, as the paper counts). L2P: everything it trains, the pool's keys and
    prompts and the head over all classes seen; all of it is shared by every experience
    (L2P adds nothing per experience but head rows for new classes). The other methods: what
    they train: the whole model for the fine-tuning baselines, nothing for NCM (0), and for the
    joint bounds what their one training on all experiences trains (Joint-LoRA: one expert
    whose head covers every class).
    """
    model = strategy.model
    if isinstance(model, RoutedExpertViT):
        return sum(p.numel() for p in model.expert_parameters(0))
    if isinstance(strategy, L2P):
        return sum(p.numel() for p in model.trainable_parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------- FT + class masking


class CurrentClassesMasking(SupervisedPlugin):
    """The paper's "FT + class masking": while an experience trains, only its classes have logits.

    Avalanche's ``IncrementalClassifier(masking=True)`` masks (sets to ``mask_value``) the units in
    its ``active_units`` mask that are off; its model adaptation switches on the classes of each
    training experience and never switches any off, so it masks the classes no experience has
    trained yet, and earlier experiences' classes compete in training. The paper masks every class
    outside the current experience: this narrows the mask to the current experience's classes
    while it trains, and gives every class trained so far back for evaluation (also for an
    evaluation inside training).
    """

    def __init__(self, head: IncrementalClassifier) -> None:
        super().__init__()
        self.head = head
        self.seen: Optional[Tensor] = None  # while an experience trains: every class trained so far
        self.current: Optional[Tensor] = None  # and its own classes

    def before_training_exp(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        # Avalanche's model adaptation (just before) has switched the current classes on.
        self.seen = self.head.active_units.clone()
        self.current = torch.zeros_like(self.seen)
        self.current[experience_classes(strategy.experience)] = 1
        self._show(self.current)

    def after_training_exp(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        self._show(self.seen)
        self.seen = self.current = None

    def before_eval(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        if self.seen is not None:
            self._show(self.seen)

    def after_eval(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        if self.current is not None:
            self._show(self.current)

    def _show(self, mask: Tensor) -> None:
        """Make ``mask`` the head's active units (an evaluation may have grown the head)."""
        units = torch.zeros_like(self.head.active_units)
        units[: len(mask)] = mask[: len(units)]
        self.head.active_units = units


# ---------------------------------------------------------------------- NCM (SimpleCIL)


class SeenClassesNCM(NCMClassifier):
    """Avalanche's ``NCMClassifier``, with ``-inf`` for classes that have no mean yet.

    It stores a zero mean for a class id below the largest seen that has none (a class of a
    later experience, in a class-incremental stream); a zero mean is at distance 1 from every
    L2-normalised feature, nearer than a real class mean whose cosine with the feature is below 0.5.
    """

    def forward(self, x: Tensor) -> Tensor:
        scores = super().forward(x)
        return scores.masked_fill(~self.class_means.to(x.device).any(dim=1), float("-inf"))


class ClassMeanUpdate(SupervisedPlugin):
    """After each experience: every class's mean L2-normalised feature over all training data seen.

    For a model with a ``feature_extractor`` and an ``NCMClassifier`` as ``eval_classifier``
    (Avalanche's ``TrainEvalModel``, as its ``update_ncm`` plugins expect). Those plugins do not
    fit: ``CurrentDataNCMUpdate`` blends a class's old and new means with momentum 0.5 when a
    class comes back (every class, in a domain-incremental stream) and runs one forward per class
    per batch; ``NCMOracle`` embeds all the data seen again after each experience. Running sums
    give the exact means with one pass over each experience. Like Avalanche's
    ``compute_class_means``: the mean of the normalised features, normalised; the data set's eval
    transforms. Normalising the sum gives that mean's direction, so no count is kept.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[int, Tensor] = {}  # per class: the sum of its normalised features

    def after_training_exp(self, strategy: SupervisedTemplate, **kwargs: Any) -> None:
        model = strategy.model
        for features, y in experience_features(strategy, model.feature_extractor, kwargs):
            features = nn.functional.normalize(features, dim=-1)
            for label in y.unique().tolist():
                self.sums[label] = self.sums.get(label, 0) + features[y == label].sum(dim=0)
        model.eval_classifier.replace_class_means_dict(
            {label: nn.functional.normalize(total, dim=0) for label, total in self.sums.items()})


class TrainingFree(SupervisedTemplate):
    """NCM and RanPAC on the frozen backbone: no gradient step, the epochs do nothing; a plugin
    (:class:`ClassMeanUpdate`, :class:`~benchmarks.compare.ranpac.RidgeUpdate`) fits the
    classifier after each experience. The optimiser, which Avalanche's template requires, never steps."""

    def training_epoch(self, **kwargs: Any) -> None:
        pass


# ---------------------------------------------------------------------- Joint-LoRA


class SingleLoRAExpert(nn.Module):
    """Joint-LoRA's model: CoLoR's :class:`ExpertViT` with a single expert, its head over ``classes``.

    One CoLoR expert (rank-r LoRA on q and v of every block of the frozen ViT) trained on the
    whole stream; with one expert there is nothing to route, so it always predicts.
    """

    def __init__(self, vit: nn.Module, rank: int, classes: Sequence[int]) -> None:
        super().__init__()
        self.experts = ExpertViT(vit, rank=rank)
        self.experts.add_expert(list(classes), experience=0)

    def forward(self, x: Tensor) -> Tensor:
        return self.experts.predict(x, 0)


class JointExpertTraining(PerExperienceCosine, JointTraining):
    """Avalanche's ``JointTraining`` of a :class:`SingleLoRAExpert`, trained as CoLoR trains an
    expert: the given SGD (the expert's parameters only) with a cosine schedule over all steps.

    The model is complete before training: ``JointTraining`` adapts every dynamic module to every
    experience, which would give the ExpertViT one more expert per experience.
    """

    def model_adaptation(self, model: Optional[nn.Module] = None) -> nn.Module:
        return (self.model if model is None else model).to(self.device)

    def make_optimizer(self, **kwargs: Any) -> None:
        self.restart_cosine()
