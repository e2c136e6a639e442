"""The loader options every loader of a strategy shares: worker processes and pinned memory.

Avalanche passes the keywords of ``strategy.train(experience, num_workers=...)`` and
``strategy.eval(...)`` to its own loaders and to every plugin callback; the strategies of this
package add their config's :class:`~avalanche_color.config.LoaderOptions` to those keywords
(the call's win), so the prototype fitting and the data scan, which build loaders of their own,
read the same settings from the callback's keywords.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader

from avalanche_color.config import LoaderOptions


def loader_options(given: Mapping[str, Any], defaults: Optional[LoaderOptions] = None) -> LoaderOptions:
    """The loader options of one call: those in ``given`` (a call's keywords), else ``defaults``'s, checked."""
    base = (defaults or LoaderOptions()).loader_options()
    return LoaderOptions(**{**base, **{name: given[name] for name in base if name in given}})


def data_loader(dataset: Any, options: LoaderOptions, device: torch.device, **loader_kwargs: Any) -> DataLoader:
    """A ``DataLoader`` with ``options``: pinned memory by default only for a CUDA device, as in Avalanche."""
    pin_memory = device.type == "cuda" if options.pin_memory is None else options.pin_memory
    return DataLoader(dataset, num_workers=options.num_workers, pin_memory=pin_memory,
                      persistent_workers=options.persistent_workers, **loader_kwargs)
