"""Every option is visible in the strategies' signatures (help(), inspect.signature, IPython),
read from the config that declares it; configs take keywords only."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pydoc
import typing

import pytest

from avalanche_color import L2P, CoLoR, CoLoRConfig, L2PConfig, SPrompts, SPromptsConfig
from avalanche_color import config as config_module
from avalanche_color.config import Options
from streams import tiny_vit

STRATEGIES = [(CoLoR, CoLoRConfig), (SPrompts, SPromptsConfig), (L2P, L2PConfig)]
AVALANCHE_KEYWORDS = ["criterion", "device", "plugins", "evaluator"]


@pytest.mark.parametrize("strategy, config_class", STRATEGIES)
def test_signature_lists_every_option_of_the_config_with_its_type_and_default(strategy, config_class):
    parameters = list(inspect.signature(strategy).parameters.values())
    hints = typing.get_type_hints(config_class)
    fields = dataclasses.fields(config_class)
    assert [p.name for p in parameters[:2]] == ["model", "config"]
    assert parameters[1].default is None and parameters[1].annotation == typing.Optional[config_class]
    options = parameters[2:2 + len(fields)]
    assert [(p.name, p.kind, p.default, p.annotation) for p in options] == [
        (f.name, inspect.Parameter.KEYWORD_ONLY, f.default, hints[f.name]) for f in fields]
    rest = parameters[2 + len(fields):]
    assert [p.name for p in rest] == [*AVALANCHE_KEYWORDS, "kwargs"]
    assert rest[-1].kind is inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize("strategy, config_class", STRATEGIES)
def test_the_signature_accepts_what_the_constructor_accepts(strategy, config_class):
    # The signature describes the real call: a strategy built through its bound arguments has those options.
    options = {"train_epochs": 2, "lr": 0.5}
    bound = inspect.signature(strategy).bind(tiny_vit(0), config_class(eval_mb_size=7), **options, peval_mode="epoch")
    made = strategy(*bound.args, **bound.kwargs)
    assert (made.config.train_epochs, made.config.lr, made.config.eval_mb_size) == (2, 0.5, 7)


def test_help_shows_the_options():
    text = pydoc.render_doc(CoLoR, renderer=pydoc.plaintext)
    for name in ("rank: int = 64", "k: int = 5", "routing: Literal['backbone', 'first_expert', 'oracle']"):
        assert name in text


def option_classes() -> list[type[Options]]:
    return [value for value in vars(config_module).values()
            if isinstance(value, type) and issubclass(value, Options) and value is not Options]


@pytest.mark.parametrize("config_class", option_classes(), ids=lambda c: c.__name__)
def test_configs_take_keywords_only(config_class):
    # CoLoRConfig(8) once set lr=8, the first field.
    with pytest.raises(TypeError, match="positional"):
        config_class(8)
    assert config_class() == config_class(**{f.name: f.default for f in dataclasses.fields(config_class) if f.init})


@pytest.mark.parametrize("strategy, config_class", STRATEGIES)
def test_editors_see_every_option_in_the_committed_type_stub(strategy, config_class):
    # Editors read the .pyi beside the module: it must be what the generator writes from the config today.
    from avalanche_color.signature_stubs import stub_path, stub_source

    committed = stub_path(strategy).read_text()
    assert committed == stub_source(strategy), (f"the stub of {strategy.__name__} is out of date: "
                                                "run python -m avalanche_color.signature_stubs")
    [stub_class] = [node for node in ast.parse(committed).body if isinstance(node, ast.ClassDef)]
    [init] = [node for node in stub_class.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"]
    keyword_only = [argument.arg for argument in init.args.kwonlyargs]
    assert keyword_only == [f.name for f in dataclasses.fields(config_class)] + AVALANCHE_KEYWORDS
    assert [a.arg for a in init.args.args] == ["self", "model", "config"] and init.args.kwarg.arg == "kwargs"
    defaults = dict(zip(keyword_only, init.args.kw_defaults))
    assert all(ast.literal_eval(defaults[f.name]) == f.default for f in dataclasses.fields(config_class))
