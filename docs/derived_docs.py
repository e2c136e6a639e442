"""griffe extension: the API pages show what the package makes from its option declarations, as ``help()`` does.

An option is declared once, in its config (``option(default, check, doc=...)``); the option groups' Attributes
sections are made from those declarations when the package is imported (``avalanche_color.utils.checks.option_group``),
and each method's and baseline's ``__init__`` names each default as its config's (``rank: int = CoLoRConfig.rank``).
griffe reads the source, where the Attributes are not written and the defaults are those names, so this extension
takes them from the imported classes (``rank: int = 64``).
Listed before ``sphinx_roles.py``, which then shows their roles as code.
"""

import inspect
import re
from typing import Any

import griffe

# ``avalanche_color.color.config.CoLoRConfig`` -> ``CoLoRConfig``, ``torch.nn.modules.module.Module`` -> ``Module``.
MODULE_PATH = re.compile(r"\b(?:[a-z_][\w]*\.)+(?=[A-Za-z_])")


class DerivedDocs(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if not (obj.is_class and obj.path.startswith("avalanche_color.") and obj.docstring is not None):
            return
        from avalanche_color.training.strategy import StrategyBase
        from avalanche_color.utils.checks import Options

        try:
            runtime = griffe.dynamic_import(obj.path)
        except ImportError:  # a class griffe reads that does not exist at run time (under TYPE_CHECKING)
            return
        if not isinstance(runtime, type):
            return
        if issubclass(runtime, Options):
            obj.docstring = like(obj.docstring, inspect.getdoc(runtime), obj)
        elif issubclass(runtime, StrategyBase) and "config_class" in vars(runtime):
            obj.set_member("__init__", method(runtime.__init__, obj))


def like(docstring: griffe.Docstring, text: str, parent: griffe.Object) -> griffe.Docstring:
    """A docstring of ``text``, parsed as ``docstring`` is."""
    return griffe.Docstring(text, lineno=docstring.lineno, endlineno=docstring.endlineno, parent=parent,
                            parser=docstring.parser, parser_options=docstring.parser_options)


def method(function: Any, cls: griffe.Class) -> griffe.Function:
    """The griffe method of ``cls`` that ``inspect.signature`` and ``inspect.getdoc`` say ``function`` is."""
    parameters = griffe.Parameters(*(
        griffe.Parameter(parameter.name, kind=griffe.ParameterKind(parameter.kind.description),
                         annotation=shown(parameter.annotation), default=shown_default(parameter.default))
        for parameter in inspect.signature(function).parameters.values()))
    made = griffe.Function(function.__name__, lineno=cls.lineno, endlineno=cls.lineno, parameters=parameters,
                           returns="None")
    made.docstring = like(cls.docstring, inspect.getdoc(function), made)
    return made


def shown(annotation: Any) -> Any:
    if annotation is inspect.Parameter.empty:
        return None
    return MODULE_PATH.sub("", inspect.formatannotation(annotation))


def shown_default(default: Any) -> Any:
    if default is inspect.Parameter.empty:
        return None
    return default.__name__ if callable(default) else repr(default)
