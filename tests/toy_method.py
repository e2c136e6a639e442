"""A method registered from outside the package, as a user's own would be: ``Toy``, whose strategy
``ToyNCM`` is NCM under another class name. As a pytest plugin (``pytest -p toy_method``, with tests/ on
the path) it registers itself before the tests are collected."""

from __future__ import annotations

from avalanche_color import NCM
from avalanche_color.runner.methods import Method, register


class ToyNCM(NCM):
    """NCM under another class name."""


TOY = Method("Toy", lambda run: {}, "toy_method:ToyNCM", about="NCM under another name")


def pytest_configure(config) -> None:
    register(TOY)
