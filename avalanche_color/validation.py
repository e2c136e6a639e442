"""Argument checks shared by the public API: errors name the argument, the value and what is allowed."""

from __future__ import annotations

from collections.abc import Collection


def check_positive_int(name: str, value: object) -> None:
    """Refuse anything but an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_positive(name: str, value: object) -> None:
    """Refuse anything but a real number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def check_choice(name: str, value: object, allowed: Collection[str]) -> None:
    """Refuse a value outside ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
