"""A row of the table: the largest absolute difference between ours and theirs, and the size of ours."""

from __future__ import annotations

from typing import Any, Optional

import torch


def max_abs(a: Any, b: Any) -> float:
    if isinstance(a, (list, tuple)):
        return max((max_abs(x, y) for x, y in zip(a, b)), default=0.0)
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) if a.numel() else 0.0


def scale_of(a: Any) -> float:
    if isinstance(a, (list, tuple)):
        return max((scale_of(x) for x in a), default=0.0)
    a = torch.as_tensor(a, dtype=torch.float64)
    return float(a.abs().max()) if a.numel() else 0.0


def row(label: str, difference: float, scale: Optional[float] = None) -> str:
    scale_text = f"   (size {scale:.2e})" if scale is not None else ""
    return f"{label:<72} max |ours - theirs| = {difference:.2e}{scale_text}"
