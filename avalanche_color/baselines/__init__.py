"""The baselines CoLoR is compared with that are not another paper's continual learner of LoRA or
prompt experts, as Avalanche strategies and plugins a script builds as it builds CoLoR.

* :class:`RanPAC` (``ranpac.py``): random ReLU features of the frozen ViT and a closed-form ridge
  readout, refitted after each experience; nothing trains.
* :class:`NCM` (``ncm.py``): SimpleCIL, the nearest class mean of the frozen ViT's normalised
  features; nothing trains.
* :class:`JointLoRA` (``joint_lora.py``): one CoLoR expert trained on the whole stream at once (an
  upper bound).
* :class:`CurrentClassesMasking` (``class_masking.py``): the plugin that makes Avalanche's ``Naive``
  the paper's "FT + class masking".

``training_free.py`` holds what NCM and RanPAC share (the template whose epochs do nothing while a plugin
fits the classifier, and the features they fit with), and ``options.py`` the baselines' options, each declared
once: :class:`~avalanche_color.baselines.options.BaselineOptions`, which every baseline takes, and
:class:`~avalanche_color.baselines.options.RanPACOptions` and
:class:`~avalanche_color.baselines.options.JointLoRAOptions` over it; each baseline's ``__init__`` shows its
options from them.
"""

from avalanche_color.baselines.class_masking import CurrentClassesMasking
from avalanche_color.baselines.joint_lora import JointLoRA, SingleLoRAExpert
from avalanche_color.baselines.ncm import NCM, NCMModel, SeenClassesNCM
from avalanche_color.baselines.options import BaselineOptions, JointLoRAOptions, RanPACOptions
from avalanche_color.baselines.ranpac import RanPAC, RanPACModel
from avalanche_color.baselines.training_free import experience_features

__all__ = ["NCM", "BaselineOptions", "CurrentClassesMasking", "JointLoRA", "JointLoRAOptions", "NCMModel", "RanPAC",
           "RanPACModel", "RanPACOptions", "SeenClassesNCM", "SingleLoRAExpert", "experience_features"]
