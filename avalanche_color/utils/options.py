"""The option machinery: frozen dataclasses whose fields carry their check (:func:`option`, :class:`Options`).

The option groups themselves are declared in :mod:`avalanche_color.config` and each method's ``config.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from avalanche_color.utils.checks import Check, require

Config = TypeVar("Config", bound="Options")


def option(default: Any, check: Check, *, expert_setting: bool = False, **field_options: Any) -> Any:
    """A config field with its check (:mod:`avalanche_color.utils.checks`). ``expert_setting``: it decides what saved experts mean,
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
