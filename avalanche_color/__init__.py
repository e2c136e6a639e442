"""CoLoR (Continual Learning with Low Rank Adaptation) for Avalanche."""

from avalanche_color.lora import QKVExperts, QVLoRA
from avalanche_color.metrics import RoutingAccuracy, routing_accuracy_metrics
from avalanche_color.model import ExpertHead, ExpertViT
from avalanche_color.plugins import LoRAExpertsPlugin, PrototypeRouterPlugin
from avalanche_color.prototypes import PrototypeRouter, fit_prototypes
from avalanche_color.strategy import CoLoR
from avalanche_color.wandb_logger import WandBLogger

__all__ = [
    "CoLoR",
    "ExpertHead",
    "ExpertViT",
    "LoRAExpertsPlugin",
    "PrototypeRouter",
    "PrototypeRouterPlugin",
    "QKVExperts",
    "QVLoRA",
    "RoutingAccuracy",
    "WandBLogger",
    "fit_prototypes",
    "routing_accuracy_metrics",
]
__version__ = "0.1.0"
