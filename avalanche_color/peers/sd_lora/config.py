"""SD-LoRA's options, declared and checked once (:class:`SDLoRAConfig`).

Defaults are the official code's Split CIFAR-100 run (WuYichen-97/SD-Lora-CL,
``exps/sdlora_c100.json`` with ``models/sdlora.py``): rank 10, SGD with momentum 0.9 at lr
0.008 and no weight decay (``_train`` builds this optimiser whatever the json's ``optimizer``
says; its MultiStepLR milestones lie past the 20 epochs, so the rate is constant),
batch 128, 20 epochs; magnitudes start at 0.8 (``backbone/lora.py``). The directions' norm, when
the newest one is normalised and what earlier magnitudes start from are the code's too
(``_LoRA_qkv_timm_train`` and ``update_network``); the paper's reading of each is an option.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, get_args

from avalanche_color.peers.lora_sum.config import DirectionNorm, LoRASumTraining, Optimizer, Schedule
from avalanche_color.utils.checks import each, one_of, option, option_group, optional, positive, positive_int

__all__ = ["DirectionNorm", "EarlierMagnitudes", "HeadInit", "NormaliseWhen", "Optimizer", "SDLoRAConfig", "Schedule"]

NormaliseWhen = Literal["next_experience", "finish"]
EarlierMagnitudes = Literal["restart", "keep"]
HeadInit = Literal["kaiming", "linear"]
DIRECTION_NORMS: tuple[str, ...] = get_args(DirectionNorm)
NORMALISE_WHENS: tuple[str, ...] = get_args(NormaliseWhen)
EARLIER_MAGNITUDES: tuple[str, ...] = get_args(EarlierMagnitudes)
HEAD_INITS: tuple[str, ...] = get_args(HeadInit)


@option_group
class SDLoRAConfig(LoRASumTraining):
    """Every option of :class:`~avalanche_color.SDLoRA`: its directions', and the shared training group with
    the code's SGD at lr 0.008, constant.

    ``SDLoRAConfig(direction_norm="product", normalise_when="finish", earlier_magnitudes="keep")`` is the
    paper's reading, which this package's SD-LoRA computed before it followed the code (docs: the
    fidelity page)."""

    rank: int = option(10, positive_int, expert_setting=True, doc="rank of each direction (paper and code: 10).")
    rank_schedule: Optional[tuple[int, ...]] = option(
        None, optional(each(positive_int)), expert_setting=True,
        doc="SD-LoRA-RR: the rank of each experience's direction, the last repeated for later ones (the code's: "
            "``(10, 10, 10, 10, 8, 8, 8, 8, 6)``); None: ``rank`` throughout.")
    magnitude_init: float = option(0.8, positive, doc="each new magnitude's start (code: 0.8).")
    direction_norm: DirectionNorm = option(
        "factors", one_of(DIRECTION_NORMS), expert_setting=True,
        doc='``"factors"`` divides a frozen direction by ``||B||_F ||A||_F`` (code); ``"product"`` by '
            '``||B A||_F`` (the paper\'s notation).')
    normalise_when: NormaliseWhen = option(
        "next_experience", one_of(NORMALISE_WHENS), expert_setting=True,
        doc='``"next_experience"``: the newest direction is normalised when the next experience starts, so the '
            'evaluation after an experience scores the network as trained (code); ``"finish"``: as soon as its '
            'experience ends, before that evaluation.')
    earlier_magnitudes: EarlierMagnitudes = option(
        "restart", one_of(EARLIER_MAGNITUDES),
        doc='``"restart"``: every earlier magnitude restarts at ``magnitude_init`` when an experience starts '
            '(code: it rebuilds the network per task); ``"keep"``: they continue from their learned values.')
    head_init: HeadInit = option(
        "kaiming", one_of(HEAD_INITS),
        doc='the classifier\'s new rows: ``"kaiming"``, Kaiming-uniform weights (gain 1) and zero bias (code: '
            '``SimpleLinear``); ``"linear"``, ``nn.Linear``\'s default.')
    lr: float = option(8e-3, positive, doc="learning rate (code: 0.008 on CIFAR-100, 0.01 on ImageNet-R).")

    @classmethod
    def from_saved(cls, options: dict[str, Any]) -> "SDLoRAConfig":
        """A folder saved before ``normalise_when`` existed was trained with every finished direction
        normalised, earlier magnitudes kept and ``nn.Linear`` head rows: it keeps that meaning."""
        return cls(**{"normalise_when": "finish", "earlier_magnitudes": "keep", "head_init": "linear", **options})

    def rank_of(self, experience: int) -> int:
        """The rank of the component of the ``experience``-th component (SD-LoRA-RR with a schedule)."""
        if self.rank_schedule is None:
            return self.rank
        return self.rank_schedule[min(experience, len(self.rank_schedule) - 1)]
