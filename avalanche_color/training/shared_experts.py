"""Another router over experts already trained: what :func:`~avalanche_color.train_stream` would give a strategy
whose training is exactly another's, without training again.

CoLoR's variants (the oracle, the class-level routers, CoLoR++, top-m, HRM-PET's re-matching) differ from CoLoR
only in how they route: each expert trains on its own experience alone, is frozen when the experience ends, and the
router is fitted afterwards in a seeded pass that leaves the run's generators untouched. So the experts a CoLoR run
ends with are, expert by expert, the experts each of its variants would have trained, and the model after
experience i is the first i + 1 of them. :func:`evaluate_trained_experts` replays a stream on that footing: for
each experience it copies the trained expert into the variant's model, fits the variant's own router from the
experience's training data, and evaluates, as ``train_stream`` does after training. The runner uses it for the
variants of a comparison that also trains the method they train as (``Method.trains_as``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

import torch

from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.training.resume import Evaluate, Record, evaluate_seen
from avalanche_color.training.router_fitting import PrototypeRouterPlugin
from avalanche_color.utils.rng import seeded

if TYPE_CHECKING:
    from avalanche.training.templates import SupervisedTemplate


def evaluate_trained_experts(strategy: "SupervisedTemplate", trained: "SupervisedTemplate", benchmark: Any, *,
                             evaluate: Optional[Evaluate] = None,
                             loader_options: Optional[Mapping[str, Any]] = None) -> list[Record]:
    """One record per training experience of ``benchmark``, as ``train_stream(strategy, benchmark)`` gives them,
    with ``trained``'s experts in place of training.

    Args:
        strategy: an untrained routed-expert strategy (CoLoR, S-Prompts, ...) whose experts are ``trained``'s
            kind and shape; its own router (and routing options) decide the evaluation.
        trained: the same method's strategy after training on every experience of the stream (of the same
            data: ``benchmark`` may differ only in what does not touch training, such as task labels).
        benchmark: has ``train_stream`` (each experience's data fits ``strategy``'s router) and ``test_stream``.
        evaluate: ``evaluate(strategy, index)`` after experience ``index``; by default, as ``train_stream``'s,
            the numeric metrics of ``strategy.eval(benchmark.test_stream[: index + 1], **loader_options)``.
        loader_options: keywords of the evaluations and of the router's embedding pass (``num_workers``, ...).
    """
    model, source = _routed(strategy, "strategy"), _routed(trained, "trained")
    stream = benchmark.train_stream
    _check_follows(model, source, len(stream))
    plugin = _router_plugin(strategy)
    fitting = plugin.fitting
    loader_options = dict(loader_options or {})
    evaluate = evaluate or evaluate_seen(benchmark, loader_options)
    records = []
    for index, experience in enumerate(stream):
        model.train()
        with seeded(0):  # the new expert's initial draws are overwritten; the run's generators stay as they are
            model.adaptation(experience)
        expert = model.bank.current_expert(int(experience.current_experience))
        if expert is None:
            raise ValueError(f"strategy's model started no expert for training experience {index}: it must be "
                             "untrained, with one expert per experience")
        _copy_expert(model, source, expert, index)
        fitting.start_experience(experience)
        if not fitting.fitted_for_good(model, expert):
            fitting.fit(model, expert, **plugin.fit_options(strategy, loader_options))  # as training fits it
        fitting.finish(model, expert)
        model.eval()
        records.append(evaluate(strategy, index))
    return records


def _routed(strategy: Any, name: str) -> RoutedExpertViT:
    model = getattr(strategy, "model", None)
    if not isinstance(model, RoutedExpertViT):
        raise TypeError(f"{name} must be a routed-expert strategy (CoLoR, S-Prompts, ...), whose model is a "
                        f"RoutedExpertViT; got {type(strategy).__name__} with a {type(model).__name__} model")
    return model


def _check_follows(model: RoutedExpertViT, source: RoutedExpertViT, experiences: int) -> None:
    """Refuses a trained model whose experts ``model`` cannot take: another kind or shape, fewer experts than the
    stream has experiences, or an expert not finished on its experience; and a ``model`` already trained."""
    if type(model) is not type(source):
        raise TypeError(f"trained's model is a {type(source).__name__}, strategy's a {type(model).__name__}: the "
                        "experts can only go to a model of their own class")
    different = {name: (getattr(source.config, name), getattr(model.config, name))
                 for name in model.expert_shape_options if getattr(source.config, name) != getattr(model.config, name)}
    if different:
        raise ValueError("trained's experts have other shapes than strategy's model makes: " + ", ".join(
            f"{name}={theirs!r} against {mine!r}" for name, (theirs, mine) in different.items()))
    if model.num_experts:
        raise ValueError(f"strategy's model already has {model.num_experts} experts: give an untrained strategy")
    origins = source.bank.experiences.tolist()
    if origins[:experiences] != list(range(experiences)) or not bool(source.bank.finished[:experiences].all()):
        raise ValueError(f"trained must have finished one expert per experience of the stream, in order: the "
                         f"stream has {experiences}, trained's experts come from experiences {origins}")


def _router_plugin(strategy: Any) -> PrototypeRouterPlugin:
    plugin = next((plugin for plugin in strategy.plugins if isinstance(plugin, PrototypeRouterPlugin)), None)
    if plugin is None:
        raise ValueError(f"strategy ({type(strategy).__name__}) has no PrototypeRouterPlugin to fit its router with")
    return plugin


@torch.no_grad()
def _copy_expert(model: RoutedExpertViT, source: RoutedExpertViT, expert: int, trained_expert: int) -> None:
    """Give ``model``'s ``expert`` the weights and head of ``source``'s ``trained_expert``."""
    for mine, theirs in zip(model.bank.expert_modules(expert), source.bank.expert_modules(trained_expert),
                            strict=True):
        mine.load_state_dict(theirs.state_dict())
    head, trained_head = model.bank.heads[expert], source.bank.heads[trained_expert]
    if not torch.equal(head.classes, trained_head.classes.to(head.classes.device)):
        raise ValueError(f"experience {trained_expert}'s classes are {head.classes.tolist()} in strategy's stream, "
                         f"{trained_head.classes.tolist()} in trained's: give the stream trained was trained on")
    head.load_state_dict(trained_head.state_dict())
