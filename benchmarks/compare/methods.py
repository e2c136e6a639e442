"""The compared methods, each built on the same pretrained backbone with the same budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from avalanche.evaluation.metrics import accuracy_metrics, forgetting_metrics
from avalanche.logging import BaseLogger
from avalanche.training import EWC, LwF, Naive, Replay
from avalanche.training.plugins import EvaluationPlugin
from avalanche.training.templates import SupervisedTemplate
from torch import nn

from avalanche_color import L2P, CoLoR, RoutedExpertViT, SPrompts, routing_accuracy_metrics

# CoLoR's routing per method name; "CoLoR-oracle" needs a stream with task label = experience.
COLOR_ROUTING = {"CoLoR": "backbone", "CoLoR++": "first_expert", "CoLoR-oracle": "oracle"}
# The prompt-tuning peers of the paper: S-Prompts routes like CoLoR (k prototypes), L2P picks prompts from a pool.
PROMPT_METHODS = ("S-Prompts", "L2P")
# Methods with a prototype router: they take k and report routing accuracy.
PROTOTYPE_ROUTED = (*COLOR_ROUTING, "S-Prompts")
# Methods that train a few parameters on a frozen backbone: cheap, so the runner gives them every seed.
FROZEN_BACKBONE = (*COLOR_ROUTING, *PROMPT_METHODS)
BASELINES = ("Naive", "EWC", "LwF", "Replay")
METHODS = (*COLOR_ROUTING, *PROMPT_METHODS, *BASELINES)


@dataclass(frozen=True)
class Budget:
    """What every method gets: epochs and batch size per experience, and a device."""

    epochs: int = 5
    batch_size: int = 32
    device: str = "cpu"


@dataclass(frozen=True)
class Hyperparameters:
    """Per-method settings (the baselines fine-tune the whole ViT, so they take a smaller lr).

    S-Prompts trains with CoLoR's optimiser and lr (SGD, cosine), so the two differ only in
    the expert; L2P with its paper's Adam and lr; both with their papers' prompt sizes.
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


def needs_task_labels(method: str) -> bool:
    return COLOR_ROUTING.get(method) == "oracle"


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
    """A strategy for ``method``; ``backbone(num_classes)`` gives a fresh pretrained ViT."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    common = dict(train_mb_size=budget.batch_size, train_epochs=budget.epochs,
                  eval_mb_size=256, device=budget.device, evaluator=evaluator(loggers or ()))
    if method in COLOR_ROUTING:
        return CoLoR(backbone(0), rank=hp.color_rank, k=hp.color_k, lr=hp.color_lr,
                     routing=COLOR_ROUTING[method], **common)
    if method == "S-Prompts":
        return SPrompts(backbone(0), prompt_length=hp.s_prompts_length, k=hp.color_k, lr=hp.color_lr, **common)
    if method == "L2P":
        return L2P(backbone(0), pool_size=hp.l2p_pool_size, prompt_length=hp.l2p_prompt_length,
                   top_n=hp.l2p_top_n, lr=hp.l2p_lr, **common)
    model = backbone(num_classes)
    baseline = dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=hp.baseline_lr, momentum=0.9),
                    criterion=nn.CrossEntropyLoss(), **common)
    if method == "Naive":
        return Naive(**baseline)
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
    (L2P adds nothing per experience but head rows for new classes). Baselines: the whole model.
    """
    model = strategy.model
    if isinstance(model, RoutedExpertViT):
        return sum(p.numel() for p in model.expert_parameters(0))
    if isinstance(strategy, L2P):
        return sum(p.numel() for p in model.trainable_parameters())
    return sum(p.numel() for p in model.parameters())
