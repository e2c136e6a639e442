"""CoLoR (Continual Learning with Low Rank Adaptation) for Avalanche."""

from avalanche_color.checkpoint import CheckpointError, read_checkpoint
from avalanche_color.data_checks import DataChecksPlugin
from avalanche_color.experts import RoutedExpertViT
from avalanche_color.expert_strategy import RoutedExpertsTemplate
from avalanche_color.l2p import L2P, L2PViT
from avalanche_color.lora import QKVExperts, QVLoRA
from avalanche_color.metrics import RoutingAccuracy, routing_accuracy_metrics
from avalanche_color.model import ExpertHead, ExpertViT
from avalanche_color.plugins import LoRAExpertsPlugin, PrototypeRouterPlugin
from avalanche_color.prompt_experts import PromptExpertViT
from avalanche_color.prompt_pool import PromptPool
from avalanche_color.prototypes import PrototypeRouter, fit_prototypes
from avalanche_color.resume import CheckpointPlugin, train_stream
from avalanche_color.s_prompts import SPrompts
from avalanche_color.strategy import CoLoR
from avalanche_color.wandb_logger import WandBLogger

__all__ = [
    "CheckpointError",
    "CheckpointPlugin",
    "CoLoR",
    "DataChecksPlugin",
    "ExpertHead",
    "ExpertViT",
    "L2P",
    "L2PViT",
    "LoRAExpertsPlugin",
    "PromptExpertViT",
    "PromptPool",
    "PrototypeRouter",
    "PrototypeRouterPlugin",
    "QKVExperts",
    "QVLoRA",
    "RoutedExpertViT",
    "RoutedExpertsTemplate",
    "RoutingAccuracy",
    "SPrompts",
    "WandBLogger",
    "fit_prototypes",
    "read_checkpoint",
    "routing_accuracy_metrics",
    "train_stream",
]
__version__ = "0.1.0"
