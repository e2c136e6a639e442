"""Type stubs (``.pyi``) that show editors every option of each strategy, written from its config.

``help()``, ``inspect.signature`` and IPython read the signature each strategy derives from its
config at import time (:func:`~avalanche_color.training.configured_strategy.strategy_signature`).
Editors and type checkers read source, not run it: for them, each strategy module has a stub
beside it with the same signature written out, generated here and never edited by hand::

    python -m avalanche_color.signature_stubs     # rewrite the stubs after changing a config

``tests/test_signatures.py`` fails when a stub differs from what this writes, so a stub never
disagrees with the options the strategy accepts.
"""

from __future__ import annotations

import collections.abc
import inspect
import sys
import typing
from pathlib import Path
from types import NoneType
from typing import Any

from avalanche_color.color.strategy import CoLoR
from avalanche_color.peers.l2p.strategy import L2P
from avalanche_color.peers.s_prompts.strategy import SPrompts
from avalanche_color.utils.files import write_atomically

STRATEGIES = (CoLoR, SPrompts, L2P)
LITERAL_DEFAULTS = (bool, int, float, str, NoneType)


class _Source:
    """Annotations as source text, collecting the imports they need."""

    def __init__(self, reserved: set[str]) -> None:
        self.imports: dict[str, set[str]] = {}
        self.modules: set[str] = set()
        self.reserved = reserved  # parameter names: a type of the same name is written with its module

    def name(self, module: str, name: str) -> str:
        if name in self.reserved:
            self.modules.add(module)
            return f"{module}.{name}"
        self.imports.setdefault(module, set()).add(name)
        return name

    def annotation(self, annotation: Any) -> str:
        if annotation is NoneType or annotation is None:
            return "None"
        if annotation is Any:
            return self.name("typing", "Any")
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Literal:
            return f"{self.name('typing', 'Literal')}[{', '.join(repr(a) for a in args)}]"
        if origin is typing.Union:
            if len(args) == 2 and NoneType in args:
                [inner] = [a for a in args if a is not NoneType]
                return f"{self.name('typing', 'Optional')}[{self.annotation(inner)}]"
            return f"{self.name('typing', 'Union')}[{', '.join(self.annotation(a) for a in args)}]"
        if origin is typing.ClassVar:
            return f"{self.name('typing', 'ClassVar')}[{self.annotation(args[0])}]"
        if origin is collections.abc.Callable:
            parameters, result = args
            listed = ", ".join(map(self.annotation, parameters))
            return f"{self.name('typing', 'Callable')}[[{listed}], {self.annotation(result)}]"
        if origin is not None:
            return f"{self.annotation(origin)}[{', '.join(self.annotation(a) for a in args)}]"
        if annotation.__module__ == "builtins":
            return annotation.__qualname__
        return self.name(annotation.__module__, annotation.__qualname__)

    def import_lines(self) -> list[str]:
        return [*(f"import {module}" for module in sorted(self.modules)),
                *(f"from {module} import {', '.join(sorted(names))}" for module, names in sorted(self.imports.items()))]


def stub_source(strategy: type) -> str:
    """The ``.pyi`` text of ``strategy``'s module: the class, its own attributes and its ``__init__``."""
    signature = inspect.signature(strategy)
    source = _Source(reserved=set(signature.parameters))
    bases = ", ".join(source.annotation(base) for base in strategy.__bases__)
    hints = typing.get_type_hints(strategy)
    own = strategy.__dict__.get("__annotations__", {})  # the class's own attributes, not inherited ones
    attributes = [f"    {name}: {source.annotation(hints[name])}" for name in own]
    parameters, keyword_only = [], False
    for parameter in signature.parameters.values():
        text = parameter.name if parameter.kind is not inspect.Parameter.VAR_KEYWORD else f"**{parameter.name}"
        text += f": {source.annotation(parameter.annotation)}"
        if parameter.default is not inspect.Parameter.empty:
            default = parameter.default
            text += f" = {default!r}" if isinstance(default, LITERAL_DEFAULTS) else " = ..."
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not keyword_only:
            parameters.append("*")
            keyword_only = True
        parameters.append(text)
    lines = [
        f"# Generated from {strategy.config_class.__name__} by `python -m avalanche_color.signature_stubs`:",
        "# do not edit (tests/test_signatures.py checks it). What editors and type checkers show.",
        *source.import_lines(),
        "",
        f"class {strategy.__name__}({bases}):",
        *attributes,
        "    def __init__(",
        "        self,",
        *(f"        {parameter}," for parameter in parameters),
        "    ) -> None: ...",
        "",
    ]
    return "\n".join(lines)


def stub_path(strategy: type) -> Path:
    """Where ``strategy``'s stub lives: beside its module's source."""
    return Path(sys.modules[strategy.__module__].__file__).with_suffix(".pyi")


def main() -> None:
    for strategy in STRATEGIES:
        path = stub_path(strategy)
        write_atomically(path, stub_source(strategy).encode())
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
