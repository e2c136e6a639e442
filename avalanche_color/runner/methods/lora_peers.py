"""The LoRA continual learners that came after CoLoR and route nothing: SD-LoRA, InfLoRA, LoRA subtraction
and CL-LoRA.

Each adapts one shared sum of LoRA components on the frozen ViT, at the runner's ``--rank`` (as
CoLoR, so the comparison is at equal rank; both papers use 10), with one classifier over every
class seen. SD-LoRA trains as its code does, at any budget: SGD with momentum 0.9 at lr 0.008,
constant (``exps/sdlora_c100.json``; the strategy's defaults). InfLoRA keeps its code's Adam and
cosine schedule; its code's lr (5e-4 over 20 epochs) underfits the runner's budgets of 2 to 5
epochs, so it runs at 5e-3, one value for every benchmark (chosen on the class-incremental digits
stream, where 5e-4 reached 0.48 and 5e-3 0.74 average accuracy after 2 epochs). Its protected
subspace's threshold rises from 0.95 to 1.0 over the stream's experiences, as in its code.

LoRA subtraction (LoRA-Sub) keeps its code's projected Adam (lr 5e-4 for the LoRA weights, 2e-3 for
its training head) and per-epoch cosine, and predicts by the nearest class mean; under ``--tune lr`` the
LoRA weights' rate is tuned, the head's stays its code's. CL-LoRA keeps its code's SGD (lr 0.03, momentum
0.9, weight decay 1e-4) with a per-epoch cosine and its two steps per batch; under torchrun each step's
gradients are averaged over the ranks.

With ``--preset paper`` (the CoLoR paper's budget: rank, batch, epochs per benchmark, shared by every
method) each keeps its own code's optimiser settings, the strategies' defaults: SD-LoRA SGD lr 0.008
constant, InfLoRA Adam lr 5e-4 with a cosine schedule.
"""

from __future__ import annotations

from typing import Any

from avalanche_color.runner.methods import Method, MethodRun, package_strategy

INF_LORA_LR = 5e-3


def _short_budget_lr(run: MethodRun, lr: float) -> dict[str, float]:
    """``lr`` for the runner's short budgets; nothing under ``--preset paper`` (the method's own default)."""
    return {} if run.config.preset == "paper" else {"lr": lr}


def _lora_options(run: MethodRun) -> dict[str, Any]:
    return dict(rank=run.rank, **run.weight_decay, **run.precision)


def _inf_lora_options(run: MethodRun) -> dict[str, Any]:
    return dict(rank=run.rank, **_short_budget_lr(run, INF_LORA_LR), num_experiences=run.num_experiences,
                **run.weight_decay, **run.precision)


LORA_PEER = dict(lora=True, frozen_backbone=True, distributed=True, checkpoint=True)  # what the four share

METHODS = (
    Method("SD-LoRA", _lora_options, package_strategy("SDLoRA"), **LORA_PEER,
           lr_chosen_by="its authors' code (SD-Lora-CL exps/sdlora_c100.json: SGD 0.008, constant)"),
    Method("InfLoRA", _inf_lora_options, package_strategy("InfLoRA"), **LORA_PEER,
           lr_chosen_by="by hand on digits_class at 2 epochs (5e-3; the code's 5e-4 underfits short budgets); "
                        "--preset paper: its code's 5e-4"),
    Method("LoRA-Sub", _lora_options, package_strategy("LoRASubtraction"), **LORA_PEER,
           lr_chosen_by="its authors' code (LoRA-Sub-DRS configs/cifar100.json: projected Adam 5e-4, head 2e-3)"),
    Method("CL-LoRA", _lora_options, package_strategy("CLLoRA"), **LORA_PEER,
           lr_chosen_by="its authors' code (CL-LoRA exps/cifar.json: SGD 0.03, per-epoch cosine)"),
)
