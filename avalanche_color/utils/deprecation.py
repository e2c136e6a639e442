"""Deprecation warnings that point at the user's line, however deep in the package they are raised."""

from __future__ import annotations

import sys
import warnings

# Frames of these packages are skipped: the warning names the first caller outside them.
_LIBRARIES = ("avalanche_color", "avalanche")


def warn_deprecated(message: str) -> None:
    """A ``DeprecationWarning`` attributed to the first caller outside this package and Avalanche.

    Python shows a ``DeprecationWarning`` by default only when it is attributed to ``__main__``;
    raised from inside a strategy's constructor (behind Avalanche's ``__init__`` wrappers), a fixed
    ``stacklevel`` would attribute it to library code, and a script would never show it.
    """
    frame, stacklevel = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARIES:
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel)
