"""Baselines that train nothing on the frozen backbone: NCM (the nearest class mean of its
normalised features, SimpleCIL) and RanPAC (a closed-form ridge over random ReLU features,
``ridge_width`` wide): :class:`~avalanche_color.NCM` and :class:`~avalanche_color.RanPAC`."""

from __future__ import annotations

from avalanche_color.runner.methods import Method, MethodRun, package_strategy


METHODS = (
    Method("NCM", lambda run: {}, package_strategy("NCM")),
    Method("RanPAC", lambda run: dict(width=run.config.ridge_width), package_strategy("RanPAC")),
)
