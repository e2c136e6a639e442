"""CoLoR (Continual Learning with Low Rank Adaptation) for Avalanche.

Where each part of the method lives:

* ``config``: the option groups the methods share, declared and checked once; each method's own
  options and config are in its folder (``color/config.py``: :class:`CoLoRConfig`, ...).
* ``lora``: LoRA on the query and value projections of every block (:class:`QKVExperts`), its kernels,
  and timm's blocks run with the experts as an argument (``lora.py``, one module).
* ``routing/``: the routers behind one interface (``Router`` in ``routing/routers.py``: fit per expert, then route
  a batch): k-means prototypes and the nearest prototype, the oracle (by task label), the class-level routers
  (beyond the paper: ridge and Gaussian over (expert, class) pairs, ``routing/classifiers.py``).
* ``experts/``: the routed model (:class:`RoutedExpertViT` in ``routed_vit.py``: the frozen ViT, an ``ExpertBank``
  of experts, heads and their records, and a router; the routing features come from the backbone or, for
  CoLoR++ (``routing_features="first_expert"``), the first expert; the evaluation cache), saved as a folder
  (``saved.py``).
* ``training/``: the strategy base in one module (``training/strategy.py``: :class:`StrategyBase`, of every
  method and baseline, and the template CoLoR and S-Prompts share over it), the
  plugin that fits the routers, checkpoint/resume, data checks, torchrun.
* ``color/``: CoLoR itself: :class:`ExpertViT`, :class:`CoLoR`, :class:`LoRAExpertsPlugin`.
* ``peers/``: the prompt-based peers, S-Prompts and L2P, and the LoRA peers that adapt one shared
  ViT and route nothing, SD-LoRA, InfLoRA and LoRA subtraction, and CL-LoRA (shared and per-experience
  adapters, class prototypes).
* ``baselines/``: the comparison's baselines as strategies a script can use: RanPAC and NCM on the
  frozen backbone, Joint-LoRA, and the paper's "FT + class masking" (a plugin).
* ``evaluation/``: the routing-accuracy metric and the W&B logger.
* ``backbones/``: two small pretrained ViTs for offline use (:func:`~avalanche_color.backbones.offline_backbone`).
* ``utils/``: value checks and checked options, atomic files, random-generator states, what an Avalanche
  experience says, a model's tensor state (stored shapes, digests, values read on the host once).

Folders import one way, each only from those before it: utils < config, backbones < lora <
routing < experts < training < color, peers < baselines < evaluation (``tests/test_layers.py``).

Importing the package is quick: the names below are imported on first use (``from avalanche_color
import CoLoR`` imports torch, timm and Avalanche then), so a script or command line can read
:mod:`avalanche_color.config` or ``--help`` without them. That first import checks that torchvision works
with the installed torch (an ``ImportError`` names both versions and the command that fixes it).
"""

from __future__ import annotations

from importlib import import_module as _import_module
from pathlib import Path  # load_pretrained's folder; not in dir(), see __dir__
from typing import TYPE_CHECKING, Any
from warnings import filterwarnings as _filterwarnings

from avalanche_color.version import __version__ as __version__  # re-exported
from avalanche_color.utils.install_check import check_torch_pair as _check_torch_pair

# Avalanche imports qpsolvers (for GEM, which nothing here uses) with any of its packages, avalanche.benchmarks
# included, and qpsolvers warns on import when no QP solver imports. Filtered here, narrowly (this message, from
# qpsolvers), since Avalanche is imported lazily from anywhere; a script must import avalanche_color before
# Avalanche for it to act, as the README's quick start does (tests/test_quick_start.py runs it without a solver).
_filterwarnings("ignore", message="no QP solver found", category=UserWarning, module="qpsolvers")

# The public names, each imported on first access (PEP 562): the TYPE_CHECKING block at the end of
# this file is their one list. Type checkers and editors read it as written (``import X as X`` marks a
# name as re-exported); at run time it is read from this file's source, never executed. A decision: a
# second list (a name -> module dict) would be quicker to read but could drift from the one editors see;
# parsing this file costs about a millisecond at import.
def _public_names() -> dict[str, str]:
    """Public name -> the module that defines it, as the ``TYPE_CHECKING`` block imports them."""
    import ast

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    [block] = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    return {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names if node.module}


_EXPORTS: dict[str, str] = _public_names()
__all__ = sorted([*_EXPORTS, "load_pretrained"])  # load_pretrained: defined below, over every model class


def load_pretrained(folder: str | Path, backbone: Any, **options: Any) -> Any:
    """Any model of this package saved with ``save_pretrained``, as the class that saved it, on a copy of
    ``backbone`` (the ViT it was trained on), in eval mode.

    The folder's ``config.json`` names the class (CoLoR's :class:`ExpertViT`, S-Prompts'
    :class:`PromptExpertViT`, :class:`SDLoRAViT`, ...); that class's ``from_pretrained`` then checks and
    loads it, with ``options`` where the class takes them (e.g. ``cache_evaluation=True`` for the routed
    models): ``load_pretrained("my_experts", vit)``.
    """
    from avalanche_color.experts.saved import SavedModelError, read_saved_config

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a saved model: it has no config.json (written by save_pretrained)")
    name = read_saved_config(folder, "config.json").get("model")
    savable = sorted(export for export in _EXPORTS
                     if export.endswith("ViT") and hasattr(__getattr__(export), "from_pretrained"))
    if name not in savable:
        raise SavedModelError(f"{folder / 'config.json'} names model {name!r}, not one this package saves "
                              f"(one of {savable})")
    return __getattr__(name).from_pretrained(folder, backbone, **options)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'avalanche_color' has no attribute {name!r}")
    # The first public name used imports torch: a torchvision made for another torch build is named there, in
    # one line with the fix, not as a RuntimeError from deep inside timm or Avalanche (utils/install_check.py).
    _check_torch_pair()
    value = getattr(_import_module(module), name)
    globals()[name] = value  # later look-ups do not come here
    return value


def __dir__() -> list[str]:  # the public names, imported or not; not the helpers above
    return sorted({*__all__, "__version__"})


if TYPE_CHECKING:  # the public names (see _public_names), imported eagerly for type checkers and editors
    from avalanche_color.backbones.preprocessing import backbone_data_config as backbone_data_config
    from avalanche_color.backbones.preprocessing import backbone_transform as backbone_transform
    from avalanche_color.baselines.class_masking import CurrentClassesMasking as CurrentClassesMasking
    from avalanche_color.baselines.joint_lora import JointLoRA as JointLoRA
    from avalanche_color.baselines.ncm import NCM as NCM
    from avalanche_color.baselines.ranpac import RanPAC as RanPAC
    from avalanche_color.color.config import CoLoRConfig as CoLoRConfig
    from avalanche_color.color.config import LoRAOptions as LoRAOptions
    from avalanche_color.color.model import ExpertViT as ExpertViT
    from avalanche_color.color.model import LoRAExpertsPlugin as LoRAExpertsPlugin
    from avalanche_color.color.strategy import CoLoR as CoLoR
    from avalanche_color.config import PrototypeOptions as PrototypeOptions
    from avalanche_color.config import RoutingOptions as RoutingOptions
    from avalanche_color.evaluation.progress import TrainingProgress as TrainingProgress
    from avalanche_color.evaluation.metrics import RoutingAccuracy as RoutingAccuracy
    from avalanche_color.evaluation.metrics import routing_accuracy_metrics as routing_accuracy_metrics
    from avalanche_color.evaluation.wandb_logger import WandBLogger as WandBLogger
    from avalanche_color.experts.routed_vit import ExpertHead as ExpertHead
    from avalanche_color.experts.saved import SavedModelError as SavedModelError
    from avalanche_color.experts.routed_vit import RoutedExpertViT as RoutedExpertViT
    from avalanche_color.lora import QKVExperts as QKVExperts
    from avalanche_color.lora import QVLoRA as QVLoRA
    from avalanche_color.peers.cl_lora.config import CLLoRAConfig as CLLoRAConfig
    from avalanche_color.peers.cl_lora.model import CLLoRAViT as CLLoRAViT
    from avalanche_color.peers.cl_lora.strategy import CLLoRA as CLLoRA
    from avalanche_color.peers.inf_lora.config import InfLoRAConfig as InfLoRAConfig
    from avalanche_color.peers.inf_lora.model import InfLoRAViT as InfLoRAViT
    from avalanche_color.peers.inf_lora.strategy import InfLoRA as InfLoRA
    from avalanche_color.peers.l2p.config import L2PConfig as L2PConfig
    from avalanche_color.peers.l2p.config import L2PModelOptions as L2PModelOptions
    from avalanche_color.peers.l2p.model import L2PViT as L2PViT
    from avalanche_color.peers.l2p.model import PromptPool as PromptPool
    from avalanche_color.peers.l2p.strategy import L2P as L2P
    from avalanche_color.peers.lora_sub.config import LoRASubtractionConfig as LoRASubtractionConfig
    from avalanche_color.peers.lora_sub.model import LoRASubtractionViT as LoRASubtractionViT
    from avalanche_color.peers.lora_sub.strategy import LoRASubtraction as LoRASubtraction
    from avalanche_color.peers.s_prompts.config import PromptOptions as PromptOptions
    from avalanche_color.peers.s_prompts.config import SPromptsConfig as SPromptsConfig
    from avalanche_color.peers.s_prompts.model import PromptExpertViT as PromptExpertViT
    from avalanche_color.peers.s_prompts.strategy import SPrompts as SPrompts
    from avalanche_color.peers.sd_lora.config import SDLoRAConfig as SDLoRAConfig
    from avalanche_color.peers.sd_lora.model import SDLoRAViT as SDLoRAViT
    from avalanche_color.peers.sd_lora.strategy import SDLoRA as SDLoRA
    from avalanche_color.routing.routers import fit_class_prototypes as fit_class_prototypes
    from avalanche_color.routing.routers import fit_prototypes as fit_prototypes
    from avalanche_color.routing.classifiers import RandomFeatureRidge as RandomFeatureRidge
    from avalanche_color.routing.routers import PrototypeRouter as PrototypeRouter
    from avalanche_color.training.resume import CheckpointError as CheckpointError
    from avalanche_color.training.resume import read_checkpoint as read_checkpoint
    from avalanche_color.training.strategy import MixedPrecision as MixedPrecision
    from avalanche_color.training.data_checks import DataChecksPlugin as DataChecksPlugin
    from avalanche_color.training.learning_check import ExpertLearnedNothing as ExpertLearnedNothing
    from avalanche_color.training.learning_check import LearningCheckPlugin as LearningCheckPlugin
    from avalanche_color.training.distributed import init_distributed as init_distributed
    from avalanche_color.training.loaders import data_loader as data_loader
    from avalanche_color.training.loaders import loader_options as loader_options
    from avalanche_color.training.resume import train_stream as train_stream
    from avalanche_color.training.shared_experts import evaluate_trained_experts as evaluate_trained_experts
    from avalanche_color.training.resume import ResumePlugin as ResumePlugin
    from avalanche_color.training.router_fitting import RouterFitting as RouterFitting
    from avalanche_color.training.strategy import StrategyBase as StrategyBase
    from avalanche_color.training.router_fitting import PrototypeRouterPlugin as PrototypeRouterPlugin
    from avalanche_color.training.strategy import RoutedExpertsTemplate as RoutedExpertsTemplate
    from avalanche_color.utils.state import tensors_digest as tensors_digest
    from avalanche_color.utils.experiences import experience_classes as experience_classes
    from avalanche_color.utils.files import write_atomically as write_atomically
