"""Every option is written in its strategy's own ``__init__``, with its type and default, and
fills one config dataclass: the two agree, and the config reaches each part of the method once."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pydoc
import re
import typing
import warnings
from pathlib import Path

import pytest
import torch
from avalanche.training import Naive
from avalanche.training.templates.base import PositionalArgumentsDeprecatedWarning

from avalanche_color import (L2P, CLLoRA, CoLoR, CoLoRConfig, ConfiguredStrategy, DataChecksPlugin, InfLoRA,
                             L2PConfig, L2PModelOptions, LoRAExpertsPlugin, LoRAOptions, LoRASubtraction,
                             PromptOptions, PrototypeOptions, PrototypeRouterPlugin, SDLoRA, SPrompts, SPromptsConfig)
from avalanche_color import config as config_module
from avalanche_color.config import LoaderOptions
from avalanche_color.runner.methods import package_strategies
from avalanche_color.utils.checks import Options
from helpers import quiet_evaluator
from streams import tiny_vit

STRATEGIES = [(CoLoR, CoLoRConfig), (SPrompts, SPromptsConfig), (L2P, L2PConfig)]
# Every strategy of the package on the one base, from the runner's registry (a registered method's is among
# them): the same call, model then config then every option.
ALL_STRATEGIES = [(strategy, strategy.config_class) for strategy in package_strategies().values()
                  if issubclass(strategy, ConfiguredStrategy)]
MODEL_OPTIONS = {CoLoR: LoRAOptions, SPrompts: PromptOptions, L2P: L2PModelOptions}
AVALANCHE_KEYWORDS = ["criterion", "device", "plugins", "evaluator"]


def init_node(strategy: type) -> ast.FunctionDef:
    """The ``__init__`` of ``strategy`` as written in its module's source."""
    tree = ast.parse(Path(inspect.getsourcefile(strategy)).read_text())
    [node] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == strategy.__name__]
    [init] = [item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"]
    return init


@pytest.mark.parametrize("strategy, config_class", ALL_STRATEGIES)
def test_the_source_lists_every_option_of_the_config_with_its_default(strategy, config_class):
    # What a reader of the strategy's module sees: model, then keyword-only config and options.
    init = init_node(strategy)
    assert [argument.arg for argument in init.args.args] == ["self", "model"]
    keywords = [argument.arg for argument in init.args.kwonlyargs]
    defaults = dict(zip(keywords, init.args.kw_defaults))
    assert keywords[0] == "config" and keywords[-len(AVALANCHE_KEYWORDS):] == AVALANCHE_KEYWORDS
    assert init.args.kwarg.arg == "kwargs"
    options = keywords[1:-len(AVALANCHE_KEYWORDS)]
    fields = {field.name: field.default for field in dataclasses.fields(config_class)}
    assert sorted(options) == sorted(fields)
    assert {name: ast.literal_eval(defaults[name]) for name in options} == fields


@pytest.mark.parametrize("strategy, config_class", ALL_STRATEGIES)
def test_the_signature_types_each_option_as_its_config_does(strategy, config_class):
    parameters = inspect.signature(strategy).parameters
    hints = typing.get_type_hints(strategy.__init__)
    field_hints = typing.get_type_hints(config_class)
    options = [name for name in parameters if name in field_hints]
    assert len(options) == len(field_hints)
    assert {name: hints[name] for name in options} == field_hints
    assert {name: parameters[name].default for name in options} == {
        field.name: field.default for field in dataclasses.fields(config_class)}
    assert hints["config"] == typing.Optional[config_class] and parameters["config"].default is None
    assert "__signature__" not in vars(strategy)  # nothing synthesised: the signature is the source's


@pytest.mark.parametrize("strategy, config_class", STRATEGIES)
def test_the_docstring_documents_every_argument(strategy, config_class):
    documented = re.findall(r"^ {12}(\*\*)?(\w+):", strategy.__init__.__doc__, flags=re.MULTILINE)
    names = [name for _, name in documented]
    assert names == [name for name in inspect.signature(strategy).parameters]


def test_help_shows_every_option_with_its_default():
    text = pydoc.render_doc(CoLoR, renderer=pydoc.plaintext)
    for shown in ("rank: int = 64", "k: int = 5", "alpha: Optional[float] = None",
                  "routing_features: Literal['backbone', 'first_expert'] = 'backbone'",
                  "router: Literal['prototypes', 'ridge', 'gaussian', 'oracle'] = 'prototypes'",
                  "distance: Literal['euclidean', 'l1', 'cosine'] = 'euclidean'", "train_epochs: int = 50"):
        assert shown in text


@pytest.mark.parametrize("strategy, config_class", ALL_STRATEGIES)
def test_a_config_and_the_same_options_as_keywords_build_the_same_strategy(strategy, config_class):
    options = {"train_epochs": 2, "lr": 0.5, "eval_mb_size": 7}
    by_keywords = strategy(tiny_vit(0), evaluator=quiet_evaluator(), **options)
    by_config = strategy(tiny_vit(0), config=config_class(**options), evaluator=quiet_evaluator())
    # Options given beside a config with a value other than their default replace its fields.
    mixed = strategy(tiny_vit(0), config=config_class(eval_mb_size=7), train_epochs=2, lr=0.5,
                     evaluator=quiet_evaluator(), peval_mode="epoch")
    assert by_keywords.config == by_config.config == mixed.config == config_class(**options)
    assert (mixed.train_epochs, mixed.eval_mb_size) == (2, 7)


@pytest.mark.parametrize("strategy, config_class", STRATEGIES)
def test_each_part_receives_its_own_group_of_options(strategy, config_class):
    made = strategy(tiny_vit(0), evaluator=quiet_evaluator(), train_epochs=2, num_workers=1)
    model_options = MODEL_OPTIONS[strategy]
    assert type(made.model.config) is model_options and made.model.config == made.config.group(model_options)
    assert made.loader_defaults == LoaderOptions(num_workers=1)
    routers = [plugin for plugin in made.plugins if isinstance(plugin, PrototypeRouterPlugin)]
    assert [type(plugin.config) for plugin in routers] == ([PrototypeOptions] if strategy is not L2P else [])


# A setting each method's model owns, and another value for it.
OWN_SETTING = {CoLoR: ("router_width", 64), SPrompts: ("router_width", 64), L2P: ("top_n", 1),
               SDLoRA: ("rank", 3), InfLoRA: ("threshold", 0.5), LoRASubtraction: ("rank", 3), CLLoRA: ("rank", 3)}


@pytest.mark.parametrize("strategy, config_class", ALL_STRATEGIES)
def test_every_strategy_is_built_alike_by_the_one_base(strategy, config_class):
    made = strategy(tiny_vit(0), evaluator=quiet_evaluator(), train_epochs=2, check_data=False)
    assert isinstance(made, ConfiguredStrategy) and made.model_settings()
    # The data checks come first among the plugins, with the method's own scan setting.
    assert type(made.plugins[0]) is DataChecksPlugin and not made.plugins[0].scan_experiences
    # A ready model brings its own settings; the budget is the strategy's.
    name, other = OWN_SETTING[strategy]
    continued = strategy(made.model, evaluator=quiet_evaluator(), train_epochs=3)
    assert continued.model is made.model and continued.config.train_epochs == 3
    assert getattr(continued.config, name) == getattr(made.config, name)
    with pytest.raises(ValueError, match=rf"leave \['{name}'\] unset \(the model's: {name}="):
        strategy(made.model, evaluator=quiet_evaluator(), **{name: other})
    # The ViT given is never adapted: the model wraps a copy.
    vit = tiny_vit(0)
    strategy(vit, evaluator=quiet_evaluator())
    assert all(torch.equal(a, b) for a, b in zip(vit.state_dict().values(), tiny_vit(0).state_dict().values()))


def test_every_strategy_and_baseline_shares_the_package_base_with_the_data_checks_first():
    from avalanche_color import NCM, JointLoRA, RanPAC, StrategyBase

    strategies = [strategy(tiny_vit(0), evaluator=quiet_evaluator()) for strategy, _ in ALL_STRATEGIES]
    strategies += [RanPAC(tiny_vit(0), evaluator=quiet_evaluator()), NCM(tiny_vit(0), evaluator=quiet_evaluator()),
                   JointLoRA(tiny_vit(0), num_classes=3, evaluator=quiet_evaluator())]
    for made in strategies:
        assert isinstance(made, StrategyBase), type(made).__name__
        assert type(made.plugins[0]) is DataChecksPlugin, type(made).__name__


def test_every_strategy_and_baseline_looks_at_its_plugins_once(monkeypatch):
    from avalanche_color import NCM, JointLoRA, RanPAC, StrategyBase

    calls = []
    real = StrategyBase.refuse_incompatible_plugins.__func__
    monkeypatch.setattr(StrategyBase, "refuse_incompatible_plugins",
                        classmethod(lambda cls, plugins: calls.append(cls.__name__) or real(cls, plugins)))
    builders = [*(strategy for strategy, _ in ALL_STRATEGIES), RanPAC, NCM,
                lambda vit, **options: JointLoRA(vit, num_classes=3, **options)]
    for build in builders:
        calls.clear()
        made = build(tiny_vit(0), plugins=[], evaluator=quiet_evaluator())
        assert calls == [type(made).__name__]


@pytest.mark.parametrize("strategy, config_class", ALL_STRATEGIES)
def test_an_incompatible_plugin_is_refused_before_the_model_is_looked_at(strategy, config_class):
    from avalanche.training.plugins import ReplayPlugin

    with pytest.raises(ValueError, match=f"{strategy.__name__} cannot use ReplayPlugin"):
        strategy(torch.nn.Linear(4, 4), plugins=[ReplayPlugin(mem_size=10)], evaluator=quiet_evaluator())


def test_a_continued_model_keeps_its_options_and_they_fill_the_config():
    first = CoLoR(tiny_vit(0), rank=4, alpha=2.0, evaluator=quiet_evaluator())
    second = CoLoR(first.model, train_epochs=3, evaluator=quiet_evaluator())
    assert second.model is first.model
    assert (second.config.rank, second.config.alpha, second.config.train_epochs) == (4, 2.0, 3)
    # Given again with the model's own value: no conflict.
    assert CoLoR(first.model, rank=4, evaluator=quiet_evaluator()).config.rank == 4
    with pytest.raises(ValueError, match=r"leave \['alpha'\] unset \(the model's: alpha=2.0\)"):
        CoLoR(first.model, alpha=8.0, evaluator=quiet_evaluator())


def option_classes() -> list[type[Options]]:
    from avalanche_color.color import config as color_config
    from avalanche_color.peers.l2p import config as l2p_config
    from avalanche_color.peers.s_prompts import config as s_prompts_config

    modules = [config_module, color_config, l2p_config, s_prompts_config]
    return sorted({value for module in modules for value in vars(module).values()
                   if isinstance(value, type) and issubclass(value, Options) and value is not Options},
                  key=lambda cls: cls.__name__)


@pytest.mark.parametrize("config_class", option_classes(), ids=lambda c: c.__name__)
def test_configs_take_keywords_only(config_class):
    # CoLoRConfig(8) once set lr=8, the first field.
    with pytest.raises(TypeError, match="positional"):
        config_class(8)
    assert config_class() == config_class(**config_class.defaults())


# ---------------------------------------------------------------------- positional arguments


def test_the_model_alone_may_be_positional_without_a_warning():
    vit, evaluators = tiny_vit(), [quiet_evaluator(), quiet_evaluator()]  # Avalanche warns: no loggers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy = CoLoR(vit, rank=8, k=20, evaluator=evaluators[0])
        by_keyword = CoLoR(model=vit, rank=8, evaluator=evaluators[1])
    assert (strategy.model.rank, strategy.config.k, by_keyword.model.rank) == (8, 20, 8)


@pytest.mark.parametrize("strategy, config_class", STRATEGIES)
def test_a_positional_argument_after_the_model_warns_as_in_avalanches_naive(strategy, config_class):
    vit = tiny_vit()
    with pytest.warns(PositionalArgumentsDeprecatedWarning) as naive:
        Naive(vit, torch.optim.SGD(vit.parameters(), lr=0.1), evaluator=quiet_evaluator())
    with pytest.warns(PositionalArgumentsDeprecatedWarning) as ours:
        made = strategy(vit, config_class(train_epochs=3), evaluator=quiet_evaluator())
    assert made.config.train_epochs == 3  # the second positional argument is the first keyword: config
    [naive_message], [our_message] = ([str(w.message) for w in record
                                       if w.category is PositionalArgumentsDeprecatedWarning]
                                      for record in (naive, ours))
    assert our_message == naive_message.replace("Naive", strategy.__name__)


def test_a_users_subclass_takes_its_model_first_too():
    class Plain(CoLoR):
        pass

    class WithOwnOption(CoLoR):
        def __init__(self, model, *, scale: float = 1.0, **options):
            super().__init__(model, **options)
            self.scale = scale

    vit, evaluators = tiny_vit(), [quiet_evaluator(), quiet_evaluator()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain, own = Plain(vit, rank=4, evaluator=evaluators[0]), WithOwnOption(vit, scale=2.0, rank=4,
                                                                                 evaluator=evaluators[1])
    assert (plain.model.rank, own.model.rank, own.scale) == (4, 4, 2.0)
    with pytest.warns(PositionalArgumentsDeprecatedWarning):
        assert Plain(vit, CoLoRConfig(rank=2), evaluator=quiet_evaluator()).model.rank == 2


# ---------------------------------------------------------------------- routing_features and router


@pytest.mark.parametrize("strategy", [CoLoR, SPrompts])
def test_a_routing_keyword_is_refused_naming_the_options_that_say_it(strategy):
    with pytest.raises(TypeError, match=rf"{strategy.__name__} got unexpected keyword arguments \['routing'\]; "
                                        r"its options are .*routing_features, router,"):
        strategy(tiny_vit(), routing="oracle")
