"""Avalanche plugins that cannot act on these strategies, refused when the strategy is built.

CoLoR and S-Prompts train a new expert per experience on that experience's own
data and never change an earlier expert; L2P trains a shared prompt pool and a
head that grows with the classes, masking the classes outside the current
experience; SD-LoRA and InfLoRA add a LoRA component per experience to one
ViT and train on the current experience's logits only. Plugins that replay old data, distil from or regularise towards the
previous model, or drive an optimiser the strategy does not use would fail
mid-run or be silently ignored, so they are refused up front with the reason.
Every other plugin (metrics, loggers, early stopping, checkpointing, your own)
is passed through.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from avalanche.training import plugins

_REPLAY = ("ReplayPlugin", "GDumbPlugin", "GSS_greedyPlugin", "MIRPlugin", "RARPlugin", "BiCPlugin",
           "GenerativeReplayPlugin", "AGEMPlugin", "GEMPlugin", "CoPEPlugin")
_DISTILLATION = ("LwFPlugin", "LFLPlugin", "FeatureDistillationPlugin")
_REGULARISATION = ("EWCPlugin", "SynapticIntelligencePlugin", "MASPlugin", "RWalkPlugin", "CWRStarPlugin")
_SCHEDULE = ("LRSchedulerPlugin",)
_FRESH_MODEL = ("FromScratchTrainingPlugin",)


def _reasons(replay: str, distillation: str, regularisation: str, schedule: str, fresh_model: str) -> dict[str, str]:
    table: dict[str, str] = {}
    for names, reason in ((_REPLAY, replay), (_DISTILLATION, distillation), (_REGULARISATION, regularisation),
                          (_SCHEDULE, schedule), (_FRESH_MODEL, fresh_model)):
        table.update(dict.fromkeys(names, reason))
    return table


ROUTED_EXPERTS = _reasons(
    replay="each expert trains on its own experience only and earlier experts are frozen, so replayed or "
           "stored samples of earlier experiences have nothing to protect, and their classes lie outside the "
           "current expert's head",
    distillation="earlier experts never change and each new expert starts from the frozen backbone, so there "
                 "is no drifting model to distil into",
    regularisation="the weights it would keep close to their old values (earlier experts) are frozen, and the "
                   "current expert's weights are new in every experience",
    schedule="the strategy builds a fresh SGD over each new expert, with its own cosine schedule per experience "
             "(the paper's); a scheduler bound to another optimiser would be silently ignored. To change the "
             "schedule, subclass the strategy and override make_optimizer",
    fresh_model="the strategy keeps its earlier experts by design; resetting the model would discard them",
)

L2P_TABLE = _reasons(
    replay="L2P is rehearsal-free and, in training, masks the logits of the classes outside the current "
           "experience, so replayed samples of earlier classes would get an infinite loss",
    distillation="L2P keeps its backbone frozen and grows its head with each experience's classes, so the "
                 "previous model's outputs do not line up with the current ones",
    regularisation="L2P's head grows with each experience's classes, so per-parameter importances of earlier "
                   "experiences do not line up with its parameters",
    schedule="L2P builds a fresh Adam over its pool and head in every experience, with the L2P paper's constant "
             "learning rate; a scheduler bound to another optimiser would be silently ignored. To change the "
             "schedule, subclass L2P and override make_optimizer",
    fresh_model="resetting the model would discard the prompt pool and head learned so far",
)

_PROTECTS_ITSELF = ("the method protects earlier experiences itself, and its parameters grow with every "
                    "experience, so a distillation or regularisation term would not line up with them")
LORA_SUM = _reasons(
    replay="the method is rehearsal-free and trains on the logits of the current experience's classes only, so "
           "replayed samples of earlier classes would get an infinite loss",
    distillation=_PROTECTS_ITSELF,
    regularisation=_PROTECTS_ITSELF,
    schedule="the strategy builds a fresh optimiser and schedule per experience (lr_schedule=); a scheduler bound "
             "to another optimiser would be silently ignored",
    fresh_model="resetting the model would discard every component learned so far",
)

def refuse_incompatible_plugins(strategy: str, given: Iterable[Any], reasons: dict[str, str]) -> None:
    """Raise a ``ValueError`` naming the first plugin in ``given`` that ``reasons`` refuses, and why."""
    for plugin in given:
        for cls in type(plugin).__mro__:
            if cls.__name__ in reasons and getattr(plugins, cls.__name__, None) is cls:
                raise ValueError(
                    f"{strategy} cannot use {type(plugin).__name__}: {reasons[cls.__name__]}. "
                    f"Remove it from plugins=[...]"
                )
