"""griffe extension: the package's docstrings name objects in Sphinx's roles (:class:`~a.b.C`); the API
pages show them as code (``C``), the name Sphinx would show."""

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")


def shown(match: re.Match) -> str:
    target = match["target"]
    return f"`{target.rsplit('.', 1)[-1] if match['tilde'] else target}`"


class SphinxRoles(griffe.Extension):
    # Once the object tree is built: the docstrings that derived_docs.py takes from the package are shown too.
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(shown, obj.docstring.value)
