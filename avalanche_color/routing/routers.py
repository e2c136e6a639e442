"""The router the options name: :func:`make_router`."""

from __future__ import annotations

from avalanche_color.config import RoutingOptions
from avalanche_color.routing.class_router import ClassRouter
from avalanche_color.routing.oracle import OracleRouter
from avalanche_color.routing.router import PrototypeRouter, Router


def make_router(options: RoutingOptions, num_features: int) -> Router:
    """The router of ``options.router`` for routing features of width ``num_features``."""
    if options.router == "prototypes":
        return PrototypeRouter(options.distance)
    if options.router == "oracle":
        return OracleRouter()
    return ClassRouter(options.router, num_features, options.router_width)
