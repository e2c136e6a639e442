"""CoLoR (Continual Learning with Low Rank Adaptation) for Avalanche.

Where each part of the method lives:

* ``config``: the option groups the methods share, declared and checked once; each method's own
  options and config are in its folder (``color/config.py``: :class:`CoLoRConfig`, ...).
* ``lora/``: LoRA on the query and value projections of every block (:class:`QKVExperts`),
  timm's blocks run with the experts as an argument (``blocks``) and mixed batches sorted by
  expert (``segments``).
* ``routing/``: the routers behind one interface (``Router`` in ``routing/router.py``: fit per expert, then route a
  batch): k-means prototypes and the nearest prototype, the class-level routers (beyond the paper:
  ridge and Gaussian over (expert, class) pairs), the oracle (by task label); the evaluation cache.
* ``experts/``: the routed model (:class:`RoutedExpertViT`: the frozen ViT, an ``ExpertBank``
  of experts, heads and their records, and a router; the routing features come from the backbone
  or, for CoLoR++ (``routing_features="first_expert"``), the first expert), saved as a folder.
* ``training/``: the training template shared by CoLoR and S-Prompts, the plugin that fits the
  routers, checkpoint/resume, data checks, torchrun.
* ``color/``: CoLoR itself: :class:`ExpertViT`, :class:`CoLoR`, :class:`LoRAExpertsPlugin`.
* ``peers/``: the prompt-based peers, S-Prompts and L2P, and the LoRA peers that adapt one shared
  ViT and route nothing, SD-LoRA and InfLoRA.
* ``evaluation/``: the routing-accuracy metric and the W&B logger.
* ``backbones/``: two small pretrained ViTs for offline use (:func:`~avalanche_color.backbones.offline_backbone`).
* ``utils/``: atomic files, random-generator states, digests, what an Avalanche experience says.

Folders import one way, each only from those before it: utils < config, backbones < lora <
routing < experts < training < color, peers < evaluation (``tests/test_layers.py``).

Importing the package is quick: the names below are imported on first use (``from avalanche_color
import CoLoR`` imports torch, timm and Avalanche then), so a script or command line can read
:mod:`avalanche_color.config` or ``--help`` without them.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from avalanche_color.version import __version__ as __version__  # re-exported

# Avalanche imports qpsolvers (for GEM, which nothing here uses), and qpsolvers warns on import when
# no QP solver is installed. Filtered here, narrowly, since Avalanche is imported lazily from anywhere.
warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning, module="qpsolvers")

# Public name -> the module that defines it; imported on first access (PEP 562).
_EXPORTS: dict[str, str] = {
    "CheckpointError": "avalanche_color.training.checkpoint",
    "CheckpointPlugin": "avalanche_color.training.resume",
    "CoLoR": "avalanche_color.color.strategy",
    "CoLoRConfig": "avalanche_color.color.config",
    "DataChecksPlugin": "avalanche_color.training.data_checks",
    "ExpertHead": "avalanche_color.experts.heads",
    "ExpertViT": "avalanche_color.color.model",
    "InfLoRA": "avalanche_color.peers.inf_lora.strategy",
    "InfLoRAConfig": "avalanche_color.peers.inf_lora.config",
    "InfLoRAViT": "avalanche_color.peers.inf_lora.model",
    "L2P": "avalanche_color.peers.l2p.strategy",
    "L2PConfig": "avalanche_color.peers.l2p.config",
    "L2PModelOptions": "avalanche_color.peers.l2p.config",
    "L2PViT": "avalanche_color.peers.l2p.model",
    "LoRAExpertsPlugin": "avalanche_color.color.plugins",
    "LoRAOptions": "avalanche_color.color.config",
    "PromptExpertViT": "avalanche_color.peers.s_prompts.model",
    "PromptOptions": "avalanche_color.peers.s_prompts.config",
    "PromptPool": "avalanche_color.peers.l2p.prompt_pool",
    "PrototypeOptions": "avalanche_color.config",
    "PrototypeRouter": "avalanche_color.routing.router",
    "PrototypeRouterPlugin": "avalanche_color.training.router_plugin",
    "QKVExperts": "avalanche_color.lora.qv_experts",
    "QVLoRA": "avalanche_color.lora.qv_experts",
    "RoutedExpertViT": "avalanche_color.experts.routed_vit",
    "RoutedExpertsTemplate": "avalanche_color.training.template",
    "RoutingAccuracy": "avalanche_color.evaluation.routing_accuracy",
    "RoutingOptions": "avalanche_color.config",
    "SPrompts": "avalanche_color.peers.s_prompts.strategy",
    "SDLoRA": "avalanche_color.peers.sd_lora.strategy",
    "SDLoRAConfig": "avalanche_color.peers.sd_lora.config",
    "SDLoRAViT": "avalanche_color.peers.sd_lora.model",
    "SPromptsConfig": "avalanche_color.peers.s_prompts.config",
    "SavedModelError": "avalanche_color.experts.integrity",
    "WandBLogger": "avalanche_color.evaluation.wandb_logger",
    "backbone_data_config": "avalanche_color.backbones.preprocessing",
    "backbone_transform": "avalanche_color.backbones.preprocessing",
    "fit_class_prototypes": "avalanche_color.routing.prototypes",
    "fit_prototypes": "avalanche_color.routing.prototypes",
    "init_distributed": "avalanche_color.training.distributed",
    "read_checkpoint": "avalanche_color.training.checkpoint",
    "routing_accuracy_metrics": "avalanche_color.evaluation.routing_accuracy",
    "train_stream": "avalanche_color.training.resume",
    # Building blocks the comparison runner (avalanche_color.runner) builds its baselines and
    # writes its files with; public so that a script can do as the runner does.
    "PerExperienceCosine": "avalanche_color.training.cosine_schedule",
    "RandomFeatureRidge": "avalanche_color.routing.ridge",
    "data_loader": "avalanche_color.training.loaders",
    "experience_classes": "avalanche_color.utils.experiences",
    "loader_options": "avalanche_color.training.loaders",
    "tensors_digest": "avalanche_color.utils.digests",
    "write_atomically": "avalanche_color.utils.files",
}

# Written out (not sorted(_EXPORTS)) so that tools reading the source see it; tests check they agree.
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
    "PerExperienceCosine",
    "PromptExpertViT",
    "PromptOptions",
    "PromptPool",
    "PrototypeOptions",
    "PrototypeRouter",
    "PrototypeRouterPlugin",
    "QKVExperts",
    "QVLoRA",
    "RandomFeatureRidge",
    "RoutedExpertViT",
    "RoutedExpertsTemplate",
    "RoutingAccuracy",
    "RoutingOptions",
    "SDLoRA",
    "SDLoRAConfig",
    "SDLoRAViT",
    "SPrompts",
    "SPromptsConfig",
    "SavedModelError",
    "WandBLogger",
    "backbone_data_config",
    "backbone_transform",
    "data_loader",
    "experience_classes",
    "fit_class_prototypes",
    "fit_prototypes",
    "init_distributed",
    "loader_options",
    "read_checkpoint",
    "routing_accuracy_metrics",
    "tensors_digest",
    "train_stream",
    "write_atomically",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'avalanche_color' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what editors and type checkers see: the same names, imported eagerly
    from avalanche_color.backbones.preprocessing import backbone_data_config, backbone_transform
    from avalanche_color.color.model import ExpertViT
    from avalanche_color.color.plugins import LoRAExpertsPlugin
    from avalanche_color.color.strategy import CoLoR
    from avalanche_color.color.config import CoLoRConfig, LoRAOptions
    from avalanche_color.config import PrototypeOptions, RoutingOptions
    from avalanche_color.evaluation.routing_accuracy import RoutingAccuracy, routing_accuracy_metrics
    from avalanche_color.evaluation.wandb_logger import WandBLogger
    from avalanche_color.experts.heads import ExpertHead
    from avalanche_color.experts.integrity import SavedModelError
    from avalanche_color.experts.routed_vit import RoutedExpertViT
    from avalanche_color.lora.qv_experts import QKVExperts, QVLoRA
    from avalanche_color.peers.inf_lora.config import InfLoRAConfig
    from avalanche_color.peers.inf_lora.model import InfLoRAViT
    from avalanche_color.peers.inf_lora.strategy import InfLoRA
    from avalanche_color.peers.l2p.config import L2PConfig, L2PModelOptions
    from avalanche_color.peers.l2p.model import L2PViT
    from avalanche_color.peers.l2p.prompt_pool import PromptPool
    from avalanche_color.peers.l2p.strategy import L2P
    from avalanche_color.peers.s_prompts.config import PromptOptions, SPromptsConfig
    from avalanche_color.peers.s_prompts.model import PromptExpertViT
    from avalanche_color.peers.s_prompts.strategy import SPrompts
    from avalanche_color.peers.sd_lora.config import SDLoRAConfig
    from avalanche_color.peers.sd_lora.model import SDLoRAViT
    from avalanche_color.peers.sd_lora.strategy import SDLoRA
    from avalanche_color.routing.prototypes import fit_class_prototypes, fit_prototypes
    from avalanche_color.routing.router import PrototypeRouter
    from avalanche_color.training.checkpoint import CheckpointError, read_checkpoint
    from avalanche_color.training.data_checks import DataChecksPlugin
    from avalanche_color.training.distributed import init_distributed
    from avalanche_color.training.resume import CheckpointPlugin, train_stream
    from avalanche_color.training.router_plugin import PrototypeRouterPlugin
    from avalanche_color.training.template import RoutedExpertsTemplate
    # used by the runner
    from avalanche_color.routing.ridge import RandomFeatureRidge
    from avalanche_color.training.cosine_schedule import PerExperienceCosine
    from avalanche_color.training.loaders import data_loader, loader_options
    from avalanche_color.utils.digests import tensors_digest
    from avalanche_color.utils.experiences import experience_classes
    from avalanche_color.utils.files import write_atomically
