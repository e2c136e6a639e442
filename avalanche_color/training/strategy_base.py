"""What every strategy of the package is, the baselines included: :class:`StrategyBase`.

Below Avalanche's ``SupervisedTemplate`` (or its ``JointTraining``), once for every strategy: the
model given first as ``Strategy(vit, **options)``, the Avalanche plugins that cannot act on the
strategy refused with the reason, the data checks first among the plugins, the loader options in
every loader, and an unpadded evaluation shard per rank under torchrun. The package's methods add
their config and per-experience loop on top
(:class:`~avalanche_color.training.configured_strategy.ConfiguredStrategy`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Optional

from avalanche.core import BasePlugin
from avalanche.training.templates import SupervisedTemplate

from avalanche_color.config import LoaderOptions
from avalanche_color.training.data_checks import DataChecksPlugin
from avalanche_color.training.plugin_compatibility import refuse_incompatible_plugins
from avalanche_color.training.strategy_parts import LoaderDefaults, ModelFirst, ShardedEvaluation
from avalanche_color.utils.checks import require, usable_device


class StrategyBase(ModelFirst, ShardedEvaluation, LoaderDefaults, SupervisedTemplate):
    """An Avalanche ``SupervisedTemplate`` as every strategy of the package builds it.

    Args:
        plugins: the user's plugins, placed after the strategy's own; the list is copied, never
            changed. Those named in :attr:`incompatible_plugins` are refused with the reason
            (:meth:`refuse_incompatible_plugins`).
        scan_experiences: the :class:`~avalanche_color.DataChecksPlugin`, always first, scans each
            training experience's samples before anything changes for it (without the scan, empty
            experiences, non-finite evaluation pixels and a non-finite loss are still refused).
        own_plugins: the plugins the method itself needs, after the data checks and before the user's.
        plugins_checked: the subclass has refused them already, before its costly steps (copying
            the ViT), so they are not looked at again.
        template_options: the keywords of Avalanche's template (``model``, ``optimizer``, ...).
    """

    # Avalanche plugins this strategy refuses, by class name, with the reason (see plugin_compatibility).
    incompatible_plugins: ClassVar[dict[str, str]] = {}
    # The options of every loader of train and eval, unless the call gives them (LoaderDefaults).
    loader_defaults: LoaderOptions = LoaderOptions()

    def __init__(self, *, plugins: Optional[Sequence[BasePlugin]], scan_experiences: bool,
                 own_plugins: Sequence[BasePlugin] = (), plugins_checked: bool = False,
                 **template_options: Any) -> None:
        if "device" in template_options:  # torch's own message would name neither the option nor the value
            require("device", template_options["device"], usable_device)
        if not plugins_checked:
            self.refuse_incompatible_plugins(plugins)
        # Bad data is refused first, before any other plugin or the model adaptation acts on it.
        checks = DataChecksPlugin(scan_experiences=scan_experiences)
        super().__init__(plugins=[checks, *own_plugins, *(plugins or ())], **template_options)

    @classmethod
    def refuse_incompatible_plugins(cls, plugins: Optional[Iterable[BasePlugin]]) -> None:
        """Raise a ``ValueError`` naming the first of ``plugins`` that :attr:`incompatible_plugins`
        refuses, and why; a subclass may call it first thing and pass ``plugins_checked=True``."""
        refuse_incompatible_plugins(cls.__name__, plugins or (), cls.incompatible_plugins)
