"""CoLoR (Continual Learning with Low Rank Adaptation) for Avalanche.

Where each part of the method lives:

* ``config``: every option, declared and checked once (:class:`CoLoRConfig`, ...).
* ``lora/``: LoRA on the query and value projections of every block (:class:`QKVExperts`),
  timm's blocks run with the experts as an argument (``blocks``) and mixed batches sorted by
  expert (``segments``).
* ``routing/``: the routing algorithms: k-means prototypes, nearest-prototype routing, the
  class-level routers (beyond the paper: ridge and Gaussian over (expert, class) pairs) and the
  evaluation cache.
* ``experts/``: the frozen ViT with one expert and head per experience, routed
  (:class:`RoutedExpertViT`; CoLoR++ (``routing="first_expert"``) and the oracle
  (``routing="oracle"``) are in :meth:`RoutedExpertViT.route`), saved as a folder.
* ``training/``: the training template shared by CoLoR and S-Prompts, the plugin that fits the
  routers, checkpoint/resume, data checks, torchrun.
* ``color/``: CoLoR itself: :class:`ExpertViT`, :class:`CoLoR`, :class:`LoRAExpertsPlugin`.
* ``peers/``: the prompt-based peers, S-Prompts and L2P, and the LoRA peers that adapt one shared
  ViT without routing, SD-LoRA and InfLoRA.
* ``evaluation/``: the routing-accuracy metric and the W&B logger.
* ``backbones/``: two small pretrained ViTs for offline use (:func:`~avalanche_color.backbones.offline_backbone`).
* ``utils/``: atomic files, random-generator states, digests, what an Avalanche experience says.

Folders import one way, each only from those before it: utils < config, backbones < lora <
routing < experts < training < color, peers < evaluation (``tests/test_layers.py``).
"""

import warnings

with warnings.catch_warnings():
    # Avalanche imports qpsolvers for GEM, which nothing here uses; without a QP solver installed,
    # qpsolvers warns on import. Imported first, under this filter, so that the warning never shows.
    warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning)
    import avalanche.training  # noqa: F401

from avalanche_color.color.model import ExpertViT
from avalanche_color.color.plugins import LoRAExpertsPlugin
from avalanche_color.color.strategy import CoLoR
from avalanche_color.config import (CoLoRConfig, L2PConfig, L2PModelOptions, LoRAOptions, PromptOptions,
                                    PrototypeOptions, RoutingOptions, SPromptsConfig)
from avalanche_color.evaluation.routing_accuracy import RoutingAccuracy, routing_accuracy_metrics
from avalanche_color.evaluation.wandb_logger import WandBLogger
from avalanche_color.experts.heads import ExpertHead
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.lora.qv_experts import QKVExperts, QVLoRA
from avalanche_color.peers.l2p.model import L2PViT
from avalanche_color.peers.l2p.prompt_pool import PromptPool
from avalanche_color.peers.inf_lora.config import InfLoRAConfig
from avalanche_color.peers.inf_lora.model import InfLoRAViT
from avalanche_color.peers.inf_lora.strategy import InfLoRA
from avalanche_color.peers.l2p.strategy import L2P
from avalanche_color.peers.s_prompts.model import PromptExpertViT
from avalanche_color.peers.s_prompts.strategy import SPrompts
from avalanche_color.peers.sd_lora.config import SDLoRAConfig
from avalanche_color.peers.sd_lora.model import SDLoRAViT
from avalanche_color.peers.sd_lora.strategy import SDLoRA
from avalanche_color.routing.prototypes import fit_class_prototypes, fit_prototypes
from avalanche_color.routing.router import PrototypeRouter
from avalanche_color.training.checkpoint import CheckpointError, read_checkpoint
from avalanche_color.training.data_checks import DataChecksPlugin
from avalanche_color.training.resume import CheckpointPlugin, train_stream
from avalanche_color.training.router_plugin import PrototypeRouterPlugin
from avalanche_color.training.template import RoutedExpertsTemplate
from avalanche_color.version import __version__ as __version__  # re-exported

__all__ = [
    "CheckpointError",
    "CheckpointPlugin",
    "CoLoR",
    "CoLoRConfig",
    "DataChecksPlugin",
    "ExpertHead",
    "ExpertViT",
    "InfLoRA",
    "InfLoRAConfig",
    "InfLoRAViT",
    "L2P",
    "L2PConfig",
    "L2PModelOptions",
    "L2PViT",
    "LoRAExpertsPlugin",
    "LoRAOptions",
    "PromptExpertViT",
    "PromptOptions",
    "PromptPool",
    "PrototypeOptions",
    "PrototypeRouter",
    "PrototypeRouterPlugin",
    "QKVExperts",
    "QVLoRA",
    "RoutedExpertViT",
    "RoutedExpertsTemplate",
    "RoutingAccuracy",
    "RoutingOptions",
    "SPrompts",
    "SPromptsConfig",
    "SDLoRA",
    "SDLoRAConfig",
    "SDLoRAViT",
    "WandBLogger",
    "fit_class_prototypes",
    "fit_prototypes",
    "read_checkpoint",
    "routing_accuracy_metrics",
    "train_stream",
]
