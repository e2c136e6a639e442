# Generated from CoLoRConfig by `python -m avalanche_color.signature_stubs`:
# do not edit (tests/test_signatures.py checks it). What editors and type checkers show.
import torch
from avalanche.core import BasePlugin
from avalanche.training.plugins.evaluation import EvaluationPlugin
from avalanche_color.color.model import ExpertViT
from avalanche_color.config import CoLoRConfig
from avalanche_color.training.template import RoutedExpertsTemplate
from collections.abc import Sequence
from torch.nn.modules.module import Module
from typing import Any, Callable, ClassVar, Literal, Optional, Union

class CoLoR(RoutedExpertsTemplate):
    model: ExpertViT
    config: CoLoRConfig
    config_class: ClassVar[type[CoLoRConfig]]
    model_class: ClassVar[type[ExpertViT]]
    def __init__(
        self,
        model: Module,
        config: Optional[CoLoRConfig] = None,
        *,
        lr: float = 0.001,
        train_mb_size: int = 128,
        train_epochs: int = 50,
        eval_mb_size: int = 128,
        eval_every: int = -1,
        momentum: float = 0.9,
        weight_decay: float = 0.0002,
        check_data: bool = True,
        k: int = 5,
        kmeans_seed: int = 0,
        kmeans_n_init: int = 10,
        prototype_data: Literal['train', 'eval'] = 'train',
        prototype_batch_size: Optional[int] = None,
        prototypes_per_class: Optional[int] = None,
        routing: Literal['backbone', 'first_expert', 'oracle'] = 'backbone',
        router: Literal['prototypes', 'ridge', 'gaussian'] = 'prototypes',
        router_width: int = 2048,
        distance: Literal['euclidean', 'l1', 'cosine'] = 'euclidean',
        normalize_features: bool = True,
        cache_evaluation: bool = False,
        rank: int = 64,
        alpha: Optional[float] = None,
        num_workers: int = 0,
        pin_memory: Optional[bool] = None,
        persistent_workers: bool = False,
        criterion: Optional[Module] = None,
        device: Union[str, torch.device] = 'cpu',
        plugins: Optional[Sequence[BasePlugin]] = None,
        evaluator: Union[EvaluationPlugin, Callable[[], EvaluationPlugin]] = ...,
        **kwargs: Any,
    ) -> None: ...
