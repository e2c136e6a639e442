"""Checks of user-given values, one vocabulary for the methods' options and the runner's settings, and
the option groups built on them: frozen dataclasses whose fields carry their check and their doc
(:func:`option`, :func:`option_group`, :class:`Options`).

A check says what is wrong with a value (``"must be an integer >= 1"``) or returns None when the
value is fine. :func:`require` turns the problem into a ``ValueError`` that names the argument, the
value and what is allowed (``rank must be an integer >= 1, got '8'``); the runner wraps the same
problem in its own :class:`~avalanche_color.runner.config.RunConfigError`. The option groups themselves
are declared in :mod:`avalanche_color.config` and each method's ``config.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import textwrap
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Optional, TypeVar

from typing_extensions import dataclass_transform  # typing's own from Python 3.11

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


def finite_number(value: object) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "must be a finite number"
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


def _sequence_of(check_items: Callable[[Sequence[object]], Optional[str]], allow_empty: bool) -> Check:
    """A tuple or list (not empty unless ``allow_empty``) whose items pass ``check_items``."""

    def check_sequence(values: object) -> Optional[str]:
        if not isinstance(values, (tuple, list)):
            return "must be a tuple or list"
        if not values and not allow_empty:
            return "must not be empty"
        return check_items(values)

    return check_sequence


def each(check: Check, *, allow_empty: bool = False) -> Check:
    """A tuple or list whose every item passes ``check`` (and, unless ``allow_empty``, not empty)."""

    def check_each(values: Sequence[object]) -> Optional[str]:
        problems = [found for found in map(check, values) if found]
        return f"must each {problems[0].removeprefix('must ')}" if problems else None

    return _sequence_of(check_each, allow_empty)


def subset_of(allowed: Collection[str], *, allow_empty: bool = False) -> Check:
    """A tuple or list of values from ``allowed``; the problem names those that are not."""
    choices = tuple(allowed)

    def check_subset(values: Sequence[object]) -> Optional[str]:
        unknown = [value for value in values if value not in choices]
        return f"must be among {choices} (not {', '.join(map(repr, unknown))})" if unknown else None

    return _sequence_of(check_subset, allow_empty)


def missing_device(value: object) -> Optional[str]:
    """What this machine lacks to run on the device ``value`` (a string or a ``torch.device``), or None: it has
    ``cpu``, ``cuda`` and ``cuda:N`` where CUDA has device N, ``mps`` where torch finds it. The one check of a
    device: a strategy's ``device`` (:func:`usable_device`) and the runner's ``--device`` word it each their way.

    Raises:
        ValueError: ``value`` names none of these devices.
    """
    import torch  # here, so that the runner's settings import no torch

    try:
        # Any value goes to torch as it is: torch.device parses more than its stub's str, int or device (bytes,
        # numpy ints) and raises TypeError for the rest.
        device = torch.device(value)  # type: ignore[call-overload]  # torch.device's stub: str, int or device
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {value!r}")
    if device.type == "cpu":
        return None
    if device.type == "mps":
        return None if torch.backends.mps.is_available() else "torch finds no MPS device here"
    if not torch.cuda.is_available():
        return f"this machine has no CUDA device (torch.cuda.is_available() is False, torch {torch.__version__})"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"this machine has {count} CUDA device(s): cuda:0 to cuda:{count - 1}"
    return None


def usable_device(value: object) -> Optional[str]:
    """A device this machine has (:func:`missing_device`): ``cpu``, ``cuda`` or ``cuda:N`` where CUDA has
    device N (a string or a ``torch.device``); ``mps`` where torch finds it."""
    try:
        missing = missing_device(value)
    except ValueError:
        return "must be cpu, cuda or cuda:N (a str or torch.device)"
    return None if missing is None else f"is not usable: {missing}; use cpu"


# ---------------------------------------------------------------------- options: fields that carry their check and doc

Config = TypeVar("Config", bound="Options")
DOC_WIDTH = 100  # the generated docstrings' line length


def option(default: Any, check: Check, *, doc: Optional[str] = None, expert_setting: bool = False) -> Any:
    """A field of an option group (:func:`option_group`), declared once: its default, its check and its doc.

    Args:
        default: the option's default value.
        check: one of the checks above; the group runs it on construction.
        doc: what the option does, for a user, with the facts behind its default (a paper's value, the
            authors' code). Every place that shows the option reads it: the group's Attributes, a method's
            ``__init__`` (``help()``, ``inspect.signature``), the docs' options table. None only where a group
            declares again a field of a group it combines, to give it another default: the doc stays that
            group's.
        expert_setting: the option decides what saved experts mean, so a checkpoint written with another value
            cannot be loaded.
    """
    return field(default=default, metadata={"check": check, "doc": doc, "expert_setting": expert_setting})


class OptionDefault:
    """An option's default where a strategy's ``__init__`` names it (``rank: int = CoLoRConfig.rank``): it reads and
    compares as the value (``help()`` and ``inspect.signature`` show ``rank: int = 64``), and a keyword left at it
    is told from one given, even given the same value (:meth:`Options.build` skips it), so an option given beside a
    config, or beside a ready model, is given. An option without a default reads ``<required>``: given there or
    in the config."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    def __repr__(self) -> str:
        return "<required>" if self.value is dataclasses.MISSING else repr(self.value)

    def __eq__(self, other: object) -> bool:
        return self.value == (other.value if isinstance(other, OptionDefault) else other)

    def __hash__(self) -> int:
        return hash(self.value)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(option,))
def option_group(cls: type[Config]) -> type[Config]:
    """The decorator of an option group (an :class:`Options` subclass): ``cls`` as a frozen dataclass that
    takes keywords only, its docstring ending with an Attributes section made from its fields' docs, and
    each option it declares an :class:`OptionDefault` as its class attribute (``CoLoRConfig.rank``: the default
    a strategy's signature names; a type checker reads the field's type).

    A field declared again without a doc (another default) takes the doc of the group it comes from.
    """
    written = vars(cls).get("__doc__")
    declared = inspect.get_annotations(cls)
    group = dataclass(frozen=True, kw_only=True)(cls)
    for spec in dataclasses.fields(group):
        if spec.metadata["doc"] is None:
            spec.metadata = MappingProxyType({**spec.metadata, "doc": _inherited_doc(group, spec.name)})
        if spec.name in declared:  # set after the dataclass is made: instances and their __init__ keep the value
            setattr(group, spec.name, OptionDefault(spec.name, spec.default))
    attributes = [docstring_item(spec.name, spec.metadata["doc"], spec.default) for spec in group.option_fields()]
    section = "Attributes:\n" + "\n".join(attributes) if attributes else ""
    group.__doc__ = "\n\n".join(part for part in (inspect.cleandoc(written or ""), section) if part)
    return group


def _inherited_doc(group: type, name: str) -> str:
    for base in group.__mro__[1:]:
        spec = getattr(base, "__dataclass_fields__", {}).get(name)
        if spec is not None and spec.metadata.get("doc"):
            return spec.metadata["doc"]
    raise TypeError(f"{group.__name__}.{name} needs doc=: no group that {group.__name__} combines documents it")


def docstring_item(name: str, doc: str, default: Any = dataclasses.MISSING) -> str:
    """One entry of a Google-style Args or Attributes section, indented and wrapped: ``name: doc`` and, when
    given, the default."""
    text = f"{name}: {doc}" + ("" if default is dataclasses.MISSING else f" Default: ``{default!r}``.")
    return textwrap.fill(text, DOC_WIDTH, initial_indent="    ", subsequent_indent="        ",
                         break_long_words=False, break_on_hyphens=False)


@option_group
class Options:
    """Base of the option groups: checks every field on construction."""

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            require(spec.name, getattr(self, spec.name), spec.metadata["check"])
        self._check_together()

    def _check_together(self) -> None:
        """Checks across fields (subclasses override)."""

    @classmethod
    def option_fields(cls) -> tuple[dataclasses.Field, ...]:
        """The options in the order a reader meets them: those the class declares itself, then those of each
        group it combines, the more specific first (its method resolution order). A method's own options
        (CoLoR's ``rank``) thus come before the shared ones (the loaders')."""
        by_name = {spec.name: spec for spec in dataclasses.fields(cls)}
        declared = (name for group in cls.__mro__ for name in inspect.get_annotations(group))
        return tuple(by_name[name] for name in dict.fromkeys(declared) if name in by_name)

    @classmethod
    def doc(cls, name: str) -> str:
        """Option ``name``'s doc, as declared (the runner's flags for it say the same)."""
        return cls.__dataclass_fields__[name].metadata["doc"]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options' names, in the order of :meth:`option_fields`."""
        return tuple(spec.name for spec in cls.option_fields())

    @classmethod
    def build(cls: type[Config], config: Optional["Options"] = None, /, **options: Any) -> Config:
        """``cls`` from a config (of ``cls`` or a subclass) and/or keyword options, checked.

        Options given as keywords replace those of ``config``; one left at its :class:`OptionDefault` (a
        strategy's keyword not given) is not given; a name that is not an option of ``cls`` is refused with
        the list of those that are.
        """
        options = {name: value for name, value in options.items() if not isinstance(value, OptionDefault)}
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
        """Every option's default; an option a user must give (Joint-LoRA's ``num_classes``) has none and is
        left out."""
        return {spec.name: spec.default for spec in cls.option_fields() if spec.default is not dataclasses.MISSING}

    @classmethod
    def expert_setting_names(cls) -> tuple[str, ...]:
        """The names of the options that decide what trained experts mean."""
        return tuple(spec.name for spec in cls.option_fields() if spec.metadata["expert_setting"])

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
