"""Checks of user-given values, one vocabulary for the methods' options and the runner's settings, and
the option groups built on them: frozen dataclasses whose fields carry their check (:func:`option`, :class:`Options`).

A check says what is wrong with a value (``"must be an integer >= 1"``) or returns None when the
value is fine. :func:`require` turns the problem into a ``ValueError`` that names the argument, the
value and what is allowed (``rank must be an integer >= 1, got '8'``); the runner wraps the same
problem in its own :class:`~avalanche_color.runner.config.RunConfigError`. The option groups themselves
are declared in :mod:`avalanche_color.config` and each method's ``config.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

Check = Callable[[object], Optional[str]]  # what is wrong with a value, or None


def require(name: str, value: object, check: Check) -> None:
    """Refuse ``value`` of the argument ``name`` if ``check`` finds something wrong with it."""
    problem = check(value)
    if problem:
        raise ValueError(f"{name} {problem}, got {value!r}")


def integer(value: object) -> Optional[str]:
    return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"


def positive_int(value: object) -> Optional[str]:
    return _integer_at_least(value, 1)


def non_negative_int(value: object) -> Optional[str]:
    return _integer_at_least(value, 0)


def _integer_at_least(value: object, low: int) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return f"must be an integer >= {low}"
    return None


def positive(value: object) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return "must be a number > 0"
    return None


def non_negative(value: object) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return "must be a number >= 0"
    return None


def fraction(value: object) -> Optional[str]:
    """A number in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        return "must be a number in (0, 1]"
    return None


def open_fraction(value: object) -> Optional[str]:
    """A number in (0, 1): a part that leaves something on both sides."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        return "must be a number in (0, 1)"
    return None


def boolean(value: object) -> Optional[str]:
    return None if isinstance(value, bool) else "must be True or False"


def text(value: object) -> Optional[str]:
    return None if isinstance(value, str) and value else "must be a non-empty string"


def path(value: object) -> Optional[str]:
    return None if isinstance(value, Path) else "must be a path"


def anything(value: object) -> Optional[str]:
    """For a value set by the code itself, not by a user: nothing to check."""
    return None


def one_of(allowed: Collection[str]) -> Check:
    choices = tuple(allowed)
    return lambda value: None if value in choices else f"must be one of {choices}"


def optional(check: Check) -> Check:
    """None, or a value that passes ``check``."""
    return lambda value: None if value is None else check(value)


def _sequence(values: object, allow_empty: bool) -> Optional[str]:
    if not isinstance(values, (tuple, list)):
        return "must be a tuple or list"
    return "must not be empty" if not values and not allow_empty else None


def each(check: Check, *, allow_empty: bool = False) -> Check:
    """A tuple or list whose every item passes ``check`` (and, unless ``allow_empty``, not empty)."""

    def check_each(values: object) -> Optional[str]:
        problem = _sequence(values, allow_empty)
        if problem:
            return problem
        problems = [found for found in map(check, values) if found]  # type: ignore[arg-type]
        return f"must each {problems[0].removeprefix('must ')}" if problems else None

    return check_each


def subset_of(allowed: Collection[str], *, allow_empty: bool = False) -> Check:
    """A tuple or list of values from ``allowed``; the problem names those that are not."""
    choices = tuple(allowed)

    def check_subset(values: object) -> Optional[str]:
        problem = _sequence(values, allow_empty)
        if problem:
            return problem
        unknown = [value for value in values if value not in choices]  # type: ignore[union-attr]
        return f"must be among {choices} (not {', '.join(map(repr, unknown))})" if unknown else None

    return check_subset


def usable_device(value: object) -> Optional[str]:
    """A device this machine has: ``cpu``, ``cuda`` or ``cuda:N`` where CUDA has device N (a string or a
    ``torch.device``); ``mps`` where torch finds it."""
    import torch  # here, so that the runner's settings import no torch

    allowed = "must be cpu, cuda or cuda:N (a str or torch.device)"
    try:
        device = torch.device(value)  # type: ignore[arg-type]  # any value: torch says what it cannot parse
    except (RuntimeError, ValueError, TypeError):
        return allowed
    if device.type == "cpu":
        return None
    if device.type == "mps":
        return None if torch.backends.mps.is_available() else "is not usable: torch finds no MPS device here"
    if device.type != "cuda":
        return allowed
    if not torch.cuda.is_available():
        return (f"is not usable: this machine has no CUDA device (torch.cuda.is_available() is False, torch "
                f"{torch.__version__}); use cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"is not usable: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    return None


# ---------------------------------------------------------------------- options: fields that carry their check

Config = TypeVar("Config", bound="Options")


def option(default: Any, check: Check, *, expert_setting: bool = False, **field_options: Any) -> Any:
    """A config field with its check (one of the checks above). ``expert_setting``: it decides what saved experts mean,
    so a checkpoint written with another value cannot be loaded. ``default=dataclasses.MISSING``
    makes the option required; ``field_options`` go to :func:`dataclasses.field`."""
    return field(default=default, metadata={"check": check, "expert_setting": expert_setting}, **field_options)


@dataclass(frozen=True, kw_only=True)
class Options:
    """Base of the option groups: checks every field on construction."""

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            require(spec.name, getattr(self, spec.name), spec.metadata["check"])
        self._check_together()

    def _check_together(self) -> None:
        """Checks across fields (subclasses override)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(spec.name for spec in dataclasses.fields(cls))

    @classmethod
    def build(cls: type[Config], config: Optional["Options"] = None, /, **options: Any) -> Config:
        """``cls`` from a config (of ``cls`` or a subclass) and/or keyword options, checked.

        Options given as keywords replace those of ``config``; a name that is not
        an option of ``cls`` is refused with the list of those that are.
        """
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise TypeError(f"{cls.__name__} has no option {', '.join(map(repr, unknown))}; "
                            f"its options are {', '.join(cls.names())}")
        if config is None:
            return cls(**options)
        if not isinstance(config, cls):
            raise TypeError(f"config must be a {cls.__name__}, got {type(config).__name__}")
        return dataclasses.replace(config, **options) if options else config

    def group(self, group: type[Config]) -> Config:
        """This config's options of ``group``, one of the groups it combines: what one part of a
        method (its model, its prototype fitting, its loaders) is given, and nothing more."""
        if type(self) is group:
            return self
        return group(**{name: getattr(self, name) for name in group.names()})

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every option's default."""
        return {spec.name: spec.default for spec in dataclasses.fields(cls)}

    @classmethod
    def expert_setting_names(cls) -> tuple[str, ...]:
        """The names of the options that decide what trained experts mean."""
        return tuple(spec.name for spec in dataclasses.fields(cls) if spec.metadata["expert_setting"])

    def expert_settings(self) -> dict[str, Any]:
        """The options that decide what trained experts mean (a checkpoint must match them)."""
        return {name: getattr(self, name) for name in self.expert_setting_names()}

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_saved(cls: type[Config], options: dict[str, Any]) -> Config:
        """``cls`` from the options a saved folder recorded (subclasses fill in what older folders lack,
        with the value those folders' weights were made under)."""
        return cls(**options)
