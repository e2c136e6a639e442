# Generated from L2PConfig by `python -m avalanche_color.signature_stubs`:
# do not edit (tests/test_signatures.py checks it). What editors and type checkers show.
import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import EvaluationPlugin
from avalanche_color.config import L2PConfig
from avalanche_color.peers.l2p.model import L2PViT
from avalanche_color.training.configured_strategy import ConfiguredStrategy
from collections.abc import Sequence
from torch import Tensor
from torch.nn.modules.module import Module
from typing import Any, Callable, ClassVar, Literal, Optional, Union

class L2P(ConfiguredStrategy):
    model: L2PViT
    config: L2PConfig
    mb_query: Optional[Tensor]
    mb_selection: Optional[Tensor]
    config_class: ClassVar[type[L2PConfig]]
    model_class: ClassVar[type[L2PViT]]
    def __init__(
        self,
        model: Module,
        config: Optional[L2PConfig] = None,
        *,
        lr: float = 0.03,
        train_mb_size: int = 128,
        train_epochs: int = 5,
        eval_mb_size: int = 128,
        eval_every: int = -1,
        pool_size: int = 10,
        prompt_length: int = 5,
        top_n: int = 5,
        head_input: Literal['prompts', 'pooled'] = 'prompts',
        class_masking: bool = True,
        prompt_init: Literal['uniform', 'zero'] = 'uniform',
        num_workers: int = 0,
        pin_memory: Optional[bool] = None,
        persistent_workers: bool = False,
        surrogate_weight: float = 0.1,
        criterion: Optional[Module] = None,
        device: Union[str, torch.device] = 'cpu',
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = ...,
        **kwargs: Any,
    ) -> None: ...
