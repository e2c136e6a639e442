"""Every option is declared once, as a field of its method's config or its baseline's options (default, check,
doc); each strategy writes its ``__init__`` in its own file, every option a keyword whose default is the config's
(``rank: int = CoLoRConfig.rank``), so the source, ``help()`` and an editor agree; the config the strategy builds
reaches each part of the method once."""

import dataclasses
import importlib
import inspect
import pkgutil
import pydoc
import re
import typing
import warnings
from pathlib import Path

import pytest
import torch

import avalanche_color
from avalanche_color import (L2P, NCM, CLLoRA, CoLoR, CoLoRConfig, DataChecksPlugin, InfLoRA, JointLoRA,
                             L2PModelOptions, LoRAOptions, LoRASubtraction, PromptOptions, PrototypeOptions,
                             PrototypeRouterPlugin, RanPAC, SDLoRA, SPrompts, SPromptsConfig, StrategyBase)
from avalanche_color.baselines import JointLoRAOptions
from avalanche_color.config import (ExpertTrainingOptions, LoaderOptions, PrecisionOptions, RoutingOptions,
                                    TrainingOptions)
from avalanche_color.runner.methods import package_strategies
from avalanche_color.training.strategy import STRATEGY_KEYWORDS
from avalanche_color.utils.checks import Options, OptionDefault, option, option_group, positive_int
from helpers import quiet_evaluator
from streams import tiny_vit

# Every strategy of the package (a registered method's is among them) and the baselines.
BASELINES = (RanPAC, NCM, JointLoRA)
ALL_STRATEGIES = [(strategy, strategy.config_class) for strategy in package_strategies().values()
                  if strategy not in BASELINES]
MODEL_OPTIONS = {CoLoR: LoRAOptions, SPrompts: PromptOptions, L2P: L2PModelOptions}
EVERY_STRATEGY = ALL_STRATEGIES + [(strategy, strategy.config_class) for strategy in BASELINES]
AVALANCHE_KEYWORDS = list(STRATEGY_KEYWORDS)
# The baselines take Avalanche's keywords but criterion.
BASELINE_KEYWORDS = ["device", "plugins", "evaluator"]
# Options declared without a default, and a value to give them.
REQUIRED = {JointLoRAOptions: {"num_classes": 3}}


def option_groups() -> list[type[Options]]:
    """Every option group the package declares: those of the shared config, CoLoR's, each peer's, the baselines'."""
    import avalanche_color.peers

    peers = [f"avalanche_color.peers.{peer.name}.config"
             for peer in pkgutil.iter_modules(avalanche_color.peers.__path__) if peer.ispkg]
    for module in ("avalanche_color.config", "avalanche_color.color.config", "avalanche_color.baselines"):
        importlib.import_module(module)
    for module in peers:
        importlib.import_module(module)
    found, pending = set(), [Options]
    while pending:
        for subclass in pending.pop().__subclasses__():
            if subclass.__module__.startswith("avalanche_color.") and subclass not in found:
                found.add(subclass)
                pending.append(subclass)
    return sorted(found, key=lambda group: group.__name__)


def one_line(text: str) -> str:
    return " ".join(text.split())


def documented(spec: dataclasses.Field) -> str:
    """An option's entry in the Attributes, on one line: its doc, and its default where it has one."""
    default = "" if spec.default is dataclasses.MISSING else f" Default: ``{spec.default!r}``."
    return f"{spec.name}: {one_line(spec.metadata['doc'])}{default}"


def keywords_of(strategy: type) -> list[str]:
    """The keywords of Avalanche that ``strategy``'s signature lists after its options."""
    return BASELINE_KEYWORDS if strategy in BASELINES else AVALANCHE_KEYWORDS


# ---------------------------------------------------------------------- the constructor a reader opens


@pytest.mark.parametrize("strategy, config_class", EVERY_STRATEGY)
def test_each_strategy_writes_its_init_in_its_own_file(strategy, config_class):
    init = vars(strategy).get("__init__")
    assert init is not None and init is strategy.__init__, "the class itself defines the __init__ it runs"
    assert not hasattr(init, "__wrapped__"), "no wrapper made at class creation"
    assert inspect.getsourcefile(init) == inspect.getsourcefile(strategy)
    source = inspect.getsource(init)
    assert source.lstrip().startswith("def __init__(") and "locals()" not in source
    assert f"{config_class.__name__}.{config_class.names()[0]}," in source


@pytest.mark.parametrize("strategy, config_class", EVERY_STRATEGY)
def test_the_signature_lists_the_model_config_every_option_with_its_default_and_avalanches_keywords(
        strategy, config_class):
    parameters = inspect.signature(strategy).parameters
    assert list(parameters) == ["model", "config", *config_class.names(), *keywords_of(strategy), "template_options"]
    assert [parameters[name].kind for name in ("model", "config")] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 2
    assert {parameters[name].kind for name in [*config_class.names(), *keywords_of(strategy)]} == {
        inspect.Parameter.KEYWORD_ONLY}
    assert parameters["template_options"].kind is inspect.Parameter.VAR_KEYWORD
    # Each option's default is its config's own (the field's OptionDefault: the value, told from a value given).
    fields = {spec.name: spec for spec in dataclasses.fields(config_class)}
    for name, spec in fields.items():
        default = parameters[name].default
        assert isinstance(default, OptionDefault) and default is getattr(config_class, name), name
        assert (default.name, default.value) == (name, spec.default), name
    # Each option's type is its field's; the config parameter takes the config class.
    hints = typing.get_type_hints(strategy.__init__)
    assert {name: hints[name] for name in fields} == typing.get_type_hints(config_class)
    assert hints["config"] == typing.Optional[config_class] and parameters["config"].default is None


@pytest.mark.parametrize("strategy, config_class", EVERY_STRATEGY)
def test_every_option_reaches_the_base_under_its_own_name(strategy, config_class, monkeypatch):
    handed: dict = {}

    class Handed(Exception):
        pass

    def record(self, **arguments):
        handed.update(arguments)
        raise Handed

    monkeypatch.setattr(StrategyBase, "__init__", record)
    with pytest.raises(Handed):
        strategy(tiny_vit(0), peval_mode="epoch")
    # Left out, every option reaches the base as its own default (none given, none crossed with another).
    assert {name: value.name for name, value in handed["options"].items()} == {n: n for n in config_class.names()}
    assert handed["template_options"] == {"peval_mode": "epoch"} and handed["config"] is None
    handed.clear()
    with pytest.raises(Handed):
        strategy(tiny_vit(0), train_mb_size=3)
    assert handed["options"]["train_mb_size"] == 3


@pytest.mark.parametrize("strategy, config_class", EVERY_STRATEGY)
def test_no_strategy_climbs_more_than_three_package_classes(strategy, config_class):
    package = [cls for cls in strategy.__mro__ if cls.__module__.startswith("avalanche_color")]
    assert len(package) <= 3 and package[-1] is StrategyBase, [cls.__name__ for cls in package]


def test_no_class_of_the_package_writes_an_init_at_class_creation():
    # StrategyBase's __init_subclass__ only keeps Avalanche's wrapper away, so no __init__ is replaced.
    source = inspect.getsource(StrategyBase.__init_subclass__)
    assert "__init__ =" not in source and "setattr" not in source
    package = Path(avalanche_color.__file__).parent
    assert [str(path) for path in package.rglob("*.py") if "__signature__" in path.read_text()] == []


@pytest.mark.parametrize("strategy, config_class", EVERY_STRATEGY)
def test_help_shows_every_option_with_its_type_and_default(strategy, config_class):
    text = one_line(pydoc.render_doc(strategy, renderer=pydoc.plaintext))
    for spec in config_class.option_fields():
        shown = "<required>" if spec.default is dataclasses.MISSING else repr(spec.default)
        assert f"{spec.name}: " in text and f"= {shown}" in text, spec.name
    # The options' docs are the config's, which the constructor names.
    assert config_class.__name__ in inspect.getdoc(strategy.__init__)


def test_help_shows_colors_options_as_a_reader_writes_them():
    text = pydoc.render_doc(CoLoR, renderer=pydoc.plaintext)
    for shown in ("rank: int = 64", "k: int = 5", "alpha: Optional[float] = None",
                  "routing_features: Literal['backbone', 'first_expert'] = 'backbone'",
                  "router: Literal['prototypes', 'ridge', 'gaussian', 'oracle'] = 'prototypes'",
                  "distance: Literal['euclidean', 'l1', 'cosine'] = 'euclidean'", "train_epochs: int = 50"):
        assert shown in text


@pytest.mark.parametrize("strategy, config_class", EVERY_STRATEGY)
def test_the_options_come_in_the_order_of_their_declaration_the_methods_own_first(strategy, config_class):
    # The config's own fields first, in the order its class body writes them.
    own = list(inspect.get_annotations(config_class))
    assert list(config_class.names()[:len(own)]) == own


def test_colors_options_are_its_groups_in_the_order_its_config_combines_them():
    groups = [LoRAOptions, RoutingOptions, PrototypeOptions, ExpertTrainingOptions, TrainingOptions, PrecisionOptions,
              LoaderOptions]
    assert list(CoLoRConfig.names()) == [name for group in groups for name in inspect.get_annotations(group)]
    assert CoLoRConfig.names()[:3] == ("rank", "alpha", "warm_start")


def test_a_baselines_option_without_a_default_is_required_by_name():
    assert repr(inspect.signature(JointLoRA).parameters["num_classes"].default) == "<required>"
    for build in (lambda: JointLoRA(tiny_vit(0)), lambda: JointLoRAOptions(rank=2)):
        with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'num_classes'"):
            build()
    # Given in the config, it need not be given again.
    assert JointLoRA(tiny_vit(0), JointLoRAOptions(num_classes=3), evaluator=quiet_evaluator()).config.num_classes == 3


@pytest.mark.parametrize("group", option_groups(), ids=lambda group: group.__name__)
def test_every_option_groups_attributes_name_each_field_with_its_doc(group):
    doc = inspect.getdoc(group)
    section = doc[doc.index("\nAttributes:\n"):]
    assert re.findall(r"^ {4}(\w+):", section, flags=re.MULTILINE) == list(group.names())
    for spec in group.option_fields():
        assert documented(spec) in one_line(section)


def test_a_field_declared_again_keeps_the_doc_of_its_group_or_writes_its_own():
    assert SPromptsConfig.defaults()["distance"] == "l1" != RoutingOptions.defaults()["distance"]
    distance = {group: {spec.name: spec for spec in group.option_fields()}["distance"].metadata["doc"]
                for group in (RoutingOptions, SPromptsConfig)}
    assert distance[RoutingOptions] != distance[SPromptsConfig] and "S-Prompts' code" in distance[SPromptsConfig]
    l2p_epochs = {spec.name: spec for spec in avalanche_color.L2PConfig.option_fields()}["train_epochs"]
    assert l2p_epochs.default == 5 and l2p_epochs.metadata["doc"] == "epochs per experience."
    with pytest.raises(TypeError, match=r"Undocumented\.width needs doc="):
        @option_group
        class Undocumented(Options):
            width: int = option(1, positive_int)


@pytest.mark.parametrize("group", option_groups(), ids=lambda group: group.__name__)
def test_option_groups_take_keywords_only(group):
    # CoLoRConfig(8) once set lr=8, the first field.
    with pytest.raises(TypeError, match="positional"):
        group(8)
    required = REQUIRED.get(group, {})
    assert group(**required) == group(**{**group.defaults(), **required})
    # defaults() holds values only: an option a user must give is not in it.
    assert set(group.defaults()) == set(group.names()) - set(required)


def test_no_module_of_the_package_gathers_options_from_locals():
    package = Path(avalanche_color.__file__).parent
    assert [str(path) for path in package.rglob("*.py") if "locals()" in path.read_text()] == []
    for strategy, _ in ALL_STRATEGIES:
        assert "locals()" not in Path(inspect.getsourcefile(strategy)).read_text()


def test_the_options_table_of_the_docs_lists_colors_options_with_their_defaults_and_docs():
    from benchmarks.reporting.readme import render_options

    rows = [line for line in render_options("CoLoRConfig").splitlines() if line.startswith("| `")]
    assert [re.match(r"\| `(\w+)`", row)[1] for row in rows] == [*CoLoRConfig.names(), *AVALANCHE_KEYWORDS]
    assert rows[0].startswith("| `rank` | 64 | LoRA rank r on the query and value projections")
    assert "| `precision` | `\"32-true\"` |" in render_options("CoLoRConfig")
    assert "`MixedPrecision`" in render_options("CoLoRConfig") and ":class:" not in render_options("CoLoRConfig")


# ---------------------------------------------------------------------- what the keywords build


@pytest.mark.parametrize("strategy, config_class", ALL_STRATEGIES)
def test_a_config_and_the_same_options_as_keywords_build_the_same_strategy(strategy, config_class):
    options = {"train_epochs": 2, "lr": 0.5, "eval_mb_size": 7}
    by_keywords = strategy(tiny_vit(0), evaluator=quiet_evaluator(), **options)
    by_config = strategy(tiny_vit(0), config=config_class(**options), evaluator=quiet_evaluator())
    # Options given beside a config replace its fields.
    mixed = strategy(tiny_vit(0), config=config_class(eval_mb_size=7), train_epochs=2, lr=0.5,
                     evaluator=quiet_evaluator(), peval_mode="epoch")
    assert by_keywords.config == by_config.config == mixed.config == config_class(**options)
    assert (mixed.train_epochs, mixed.eval_mb_size) == (2, 7)
    # Given means given: an option given with its default value replaces the config's field all the same.
    default = config_class.defaults()["train_epochs"]
    assert strategy(tiny_vit(0), config=config_class(train_epochs=default + 1), train_epochs=default,
                    evaluator=quiet_evaluator()).config.train_epochs == default


@pytest.mark.parametrize("strategy, config_class", EVERY_STRATEGY)
def test_an_unknown_keyword_is_refused_naming_the_options(strategy, config_class):
    with pytest.raises(TypeError, match=rf"{strategy.__name__} got unexpected keyword arguments \['colour'\]; its "
                                        rf"options are {re.escape(', '.join(config_class.names()))} "
                                        rf"\(see {config_class.__name__}\)"):
        strategy(tiny_vit(0), colour="blue", evaluator=quiet_evaluator(), **REQUIRED.get(config_class, {}))


@pytest.mark.parametrize("strategy", list(MODEL_OPTIONS))
def test_each_part_receives_its_own_group_of_options(strategy):
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
    assert isinstance(made, StrategyBase) and made.model_settings()
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
    # Given means given: the default value, given, contradicts the model's own too.
    with pytest.raises(ValueError, match=r"leave \['rank'\] unset \(the model's: rank=4\)"):
        CoLoR(first.model, rank=64, evaluator=quiet_evaluator())


# ---------------------------------------------------------------------- positional arguments


def test_the_model_and_the_config_may_be_positional_without_a_warning():
    vit = tiny_vit()
    evaluators = [quiet_evaluator() for _ in range(3)]  # Avalanche warns: no loggers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy = CoLoR(vit, rank=8, k=20, evaluator=evaluators[0])
        by_keyword = CoLoR(model=vit, rank=8, evaluator=evaluators[1])
        by_config = CoLoR(vit, CoLoRConfig(rank=2), evaluator=evaluators[2])
    assert (strategy.model.rank, strategy.config.k, by_keyword.model.rank, by_config.model.rank) == (8, 20, 8, 2)
    # Every other argument is a keyword.
    with pytest.raises(TypeError, match="positional argument"):
        CoLoR(vit, None, 8)


@pytest.mark.parametrize("strategy, config_class", EVERY_STRATEGY)
def test_every_strategy_takes_its_model_and_config_by_position(strategy, config_class):
    required, evaluator = REQUIRED.get(config_class, {}), quiet_evaluator()  # Avalanche warns: no loggers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = strategy(tiny_vit(), config_class(train_mb_size=4, **required), evaluator=evaluator)
    assert made.config == config_class(train_mb_size=4, **required)


def test_a_users_subclass_takes_its_model_first_too():
    class Plain(CoLoR):
        pass

    class WithOwnOption(CoLoR):
        def __init__(self, model, *, scale: float = 1.0, **options):
            super().__init__(model, **options)
            self.scale = scale

    vit, evaluators = tiny_vit(), [quiet_evaluator(), quiet_evaluator(), quiet_evaluator()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain, own = Plain(vit, rank=4, evaluator=evaluators[0]), WithOwnOption(vit, scale=2.0, rank=4,
                                                                                 evaluator=evaluators[1])
        assert Plain(vit, CoLoRConfig(rank=2), evaluator=evaluators[2]).model.rank == 2
    assert (plain.model.rank, own.model.rank, own.scale) == (4, 4, 2.0)
    # A subclass shows the options it inherits, or the signature it writes itself.
    assert inspect.signature(Plain) == inspect.signature(CoLoR)
    assert list(inspect.signature(WithOwnOption).parameters) == ["model", "scale", "options"]


# ---------------------------------------------------------------------- routing_features and router


@pytest.mark.parametrize("strategy", [CoLoR, SPrompts])
def test_a_routing_keyword_is_refused_naming_the_options_that_say_it(strategy):
    with pytest.raises(TypeError, match=rf"{strategy.__name__} got unexpected keyword arguments \['routing'\]; "
                                        r"its options are .*routing_features, router,"):
        strategy(tiny_vit(), routing="oracle")
