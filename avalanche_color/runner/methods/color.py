"""CoLoR and its variants: how the experts route (the paper's prototypes on the backbone's or the
first expert's features, the task label, or beyond the paper a class-level ridge or Gaussian
router), and Joint-LoRA, one CoLoR expert trained on the whole stream at once (an upper bound,
:class:`~avalanche_color.JointLoRA`).
Every variant's experts train exactly as CoLoR's."""

from __future__ import annotations

from typing import Any

from avalanche_color.runner.methods import Method, MethodRun, package_strategy


COLOR_LR_CHOICE = ("--color-lr (default 0.05, set by hand for the runner's short budgets); --preset paper: "
                   "the CoLoR paper's")


def _color_options(routing: dict[str, str]):
    def options(run: MethodRun) -> dict[str, Any]:
        ridge = {"router_width": run.config.ridge_width} if routing.get("router") == "ridge" else {}
        return dict(rank=run.rank, lr=run.config.color_lr, **routing, k=run.k,
                    prototypes_per_class=run.config.prototypes_per_class, **ridge, **run.weight_decay,
                    **run.precision)
    return options


def _variant(name: str, task_labels: bool = False, **routing: str) -> Method:
    return Method(name, _color_options(routing), package_strategy("CoLoR"), lora=True, prototypes=True,
                  frozen_backbone=True, task_labels=task_labels, distributed=True, checkpoint=True,
                  lr_chosen_by=COLOR_LR_CHOICE)


def _joint_lora_options(run: MethodRun) -> dict[str, Any]:
    from avalanche_color import CoLoRConfig

    color = CoLoRConfig()  # CoLoR's momentum and weight decay
    return dict(rank=run.rank, lr=run.config.color_lr, momentum=color.momentum,
                weight_decay=run.weight_decay.get("weight_decay", color.weight_decay))


def _build_joint_lora(run: MethodRun, options: dict[str, Any]):
    from avalanche_color import JointLoRA

    return JointLoRA(run.backbone(0), num_classes=run.num_classes, **options, **run.strategy_options)


METHODS = (
    _variant("CoLoR", routing_features="backbone", router="prototypes"),
    _variant("CoLoR++", routing_features="first_expert", router="prototypes"),
    _variant("CoLoR-oracle", task_labels=True, routing_features="backbone", router="oracle"),
    _variant("CoLoR-ridge", routing_features="backbone", router="ridge"),
    _variant("CoLoR-gaussian", routing_features="backbone", router="gaussian"),
    _variant("CoLoR++-ridge", routing_features="first_expert", router="ridge"),
    Method("Joint-LoRA", _joint_lora_options, _build_joint_lora, lora=True, joint=True,
           lr_chosen_by=COLOR_LR_CHOICE),
)
