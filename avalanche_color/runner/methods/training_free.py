"""Baselines that train nothing on the frozen backbone: NCM (the nearest class mean of its
normalised features, SimpleCIL) and RanPAC (a closed-form ridge over random ReLU features,
``ridge_width`` wide): :class:`~avalanche_color.NCM` and :class:`~avalanche_color.RanPAC`."""

from __future__ import annotations

from typing import Any

from avalanche_color.runner.methods import Method, MethodRun


def _build_ncm(run: MethodRun, options: dict[str, Any]):
    from avalanche_color import NCM

    return NCM(run.backbone(0), **options, **run.strategy_options)


def _build_ranpac(run: MethodRun, options: dict[str, Any]):
    from avalanche_color import RanPAC

    return RanPAC(run.backbone(0), **options, **run.strategy_options)


METHODS = (
    Method("NCM", lambda run: {}, _build_ncm),
    Method("RanPAC", lambda run: dict(width=run.config.ridge_width), _build_ranpac),
)
