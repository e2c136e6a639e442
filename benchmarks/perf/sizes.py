"""The sizes every section of ``python -m benchmarks.perf`` shares: classes per expert, the class routers,
the photos."""

from __future__ import annotations

from avalanche_color import CoLoRConfig

CLASSES = 10  # per expert
CLASS_ROUTERS = ("ridge", "gaussian")
ROUTER_WIDTH = CoLoRConfig().router_width  # the default M
PHOTOS = 64  # distinct JPEGs the loader cycles over
