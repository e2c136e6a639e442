"""The routed model's parts together: one routing pass through the model's call on every path (the
strategies and the drop-in plugins on Avalanche's Naive, with task labels and without), the router
interface, and the options and files of earlier versions."""

import json

import pytest
import torch
from avalanche.benchmarks import benchmark_from_datasets
from avalanche.benchmarks.utils import as_classification_dataset
from avalanche.training import Naive
from torch.utils.data import TensorDataset

from avalanche_color import (CoLoR, ExpertViT, LoRAExpertsPlugin, PromptExpertViT, PrototypeRouterPlugin,
                             RoutingOptions, SPrompts)
from avalanche_color.routing.routers import ClassRouter, OracleRouter, PrototypeRouter, Router, make_router
from helpers import UNSATURATED, quiet_evaluator, stream_metric, tiny_color, train_all
from streams import class_stream, domain_stream, tiny_vit


def backbone_passes(model: torch.nn.Module) -> list[int]:
    """A list that gets the batch size of every pass through ``model``'s patch embedding (one per backbone pass)."""
    passes: list[int] = []
    model.backbone.patch_embed.register_forward_hook(lambda module, args, out: passes.append(args[0].shape[0]))
    return passes


def naive_with_drop_in_plugins(**plugin_options) -> Naive:
    vit = tiny_vit()
    return Naive(model=vit, optimizer=torch.optim.SGD(vit.parameters(), lr=0.05, momentum=0.9), train_epochs=4,
                 train_mb_size=16, eval_mb_size=32, evaluator=quiet_evaluator(),
                 plugins=[LoRAExpertsPlugin(rank=4, **plugin_options), PrototypeRouterPlugin(k=3)])


def stream_without_task_labels():
    """Two class-incremental experiences whose data sets carry no task labels at all."""
    source = class_stream(num_experiences=2)

    def plain(stream):
        datasets = []
        for experience in stream:
            labels = torch.tensor([int(sample[1]) for sample in experience.dataset])
            dataset = TensorDataset(torch.stack([sample[0] for sample in experience.dataset]), labels)
            dataset.targets = labels.tolist()  # what as_classification_dataset reads
            datasets.append(as_classification_dataset(dataset))
        return datasets

    return benchmark_from_datasets(train=plain(source.train_stream), test=plain(source.test_stream))


@pytest.mark.parametrize("method", ["CoLoR", "SPrompts"])
def test_forward_hooks_on_the_strategys_model_fire_in_training_and_evaluation(method):
    benchmark = class_stream(num_experiences=2)
    strategy = (tiny_color(**UNSATURATED) if method == "CoLoR" else
                SPrompts(tiny_vit(), prompt_length=2, k=3, train_epochs=1, train_mb_size=16, eval_mb_size=32,
                         evaluator=quiet_evaluator()))
    seen: list[tuple[bool, object]] = []
    strategy.model.register_forward_hook(lambda model, args, out: seen.append((model.training, out)))
    strategy.train(benchmark.train_stream[0])
    assert seen and all(training and isinstance(out, torch.Tensor) for training, out in seen)
    seen.clear()
    strategy.eval(benchmark.test_stream)
    # In evaluation the strategy asks for the routed experts too: the hooks see (logits, experts).
    assert not any(training for training, _ in seen) and all(isinstance(out, tuple) for _, out in seen)
    assert sum(len(logits) for _, (logits, _) in seen) == sum(len(e.dataset) for e in benchmark.test_stream)


@pytest.mark.parametrize("path", ["CoLoR", "Naive with the drop-in plugins"])
def test_the_backbone_runs_twice_per_evaluation_batch(path):
    benchmark = class_stream(num_experiences=2)
    strategy = tiny_color(**UNSATURATED) if path == "CoLoR" else naive_with_drop_in_plugins()
    train_all(strategy, benchmark)
    passes = backbone_passes(strategy.model)
    results = strategy.eval(benchmark.test_stream)
    batch = strategy.eval_mb_size
    batches = [min(batch, len(e.dataset) - start) for e in benchmark.test_stream
               for start in range(0, len(e.dataset), batch)]
    assert passes == [size for size in batches for _ in range(2)]  # to route, then with the experts
    assert stream_metric(results, "RoutingAcc") is not None


def test_the_oracle_routes_without_a_backbone_pass():
    benchmark = class_stream(num_experiences=2, task_labels=True)
    strategy = tiny_color(router="oracle", **UNSATURATED)
    train_all(strategy, benchmark)
    passes = backbone_passes(strategy.model)
    results = strategy.eval(benchmark.test_stream)
    assert len(passes) == len(benchmark.test_stream)  # one batch per experience, one pass each
    assert stream_metric(results, "RoutingAcc") == 1.0


def test_naive_with_the_drop_in_plugins_evaluates_a_stream_without_task_labels():
    benchmark = stream_without_task_labels()
    assert not hasattr(benchmark.test_stream[0], "task_labels")
    naive = naive_with_drop_in_plugins()
    results = train_all(naive, benchmark)  # without task labels, Avalanche names the stream metrics without a task
    assert isinstance(naive.model, ExpertViT) and naive.model.num_experts == 2
    assert results["RoutingAcc_Stream/eval_phase/test_stream"] > 0.9
    assert results["Top1_Acc_Stream/eval_phase/test_stream"] > 0.6  # chance: 0.25
    color = tiny_color(train_epochs=4, lr=0.05)  # CoLoR itself, on the same stream
    assert train_all(color, benchmark)["RoutingAcc_Stream/eval_phase/test_stream"] > 0.9


@pytest.mark.parametrize("model_class", [ExpertViT, PromptExpertViT])
def test_the_routed_experts_are_the_ones_routing_gives_and_the_metric_reads(model_class):
    benchmark = domain_stream(num_domains=2)
    strategy = tiny_color(**UNSATURATED) if model_class is ExpertViT else SPrompts(
        tiny_vit(), prompt_length=2, k=3, train_epochs=1, train_mb_size=16, evaluator=quiet_evaluator())
    train_all(strategy, benchmark)
    model = strategy.model.eval()
    images = torch.stack([s[0] for s in benchmark.test_stream[1].dataset])
    with torch.no_grad():
        logits, routed = model(images, return_experts=True)
        assert torch.equal(routed, model.route(images)) and torch.equal(logits, model(images))
        assert torch.equal(logits, model(images, experts=routed))
        assert model(images, experts=0, return_experts=True)[1] is None  # given experts: nothing was routed


def test_make_router_builds_the_router_the_options_name():
    kinds = {"prototypes": PrototypeRouter, "ridge": ClassRouter, "gaussian": ClassRouter, "oracle": OracleRouter}
    for name, kind in kinds.items():
        router = make_router(RoutingOptions(router=name, router_width=16), num_features=8)
        assert isinstance(router, Router) and type(router) is kind
    assert not OracleRouter.uses_features and PrototypeRouter.uses_features


def test_every_router_fits_from_features_and_labels_and_routes_a_batch():
    generator = torch.Generator().manual_seed(0)
    centres = 4 * torch.randn(2, 8, generator=generator)
    features = torch.cat([c + 0.1 * torch.randn(30, 8, generator=generator) for c in centres])
    labels = torch.arange(4).repeat_interleave(15)
    for name in ("prototypes", "ridge", "gaussian"):
        router = make_router(RoutingOptions(router=name, router_width=64), num_features=8)
        for expert in (0, 1):
            rows = slice(30 * expert, 30 * (expert + 1))
            router.fit(expert, features[rows], labels[rows])
            router.finish(expert)
            assert router.knows(expert)
        assert torch.equal(router(features), torch.arange(2).repeat_interleave(30)), name
    oracle = OracleRouter()
    assert oracle(None, torch.tensor([2, 0, 2]), expert_tasks=torch.tensor([0, 2, 2])).tolist() == [2, 0, 2]
    with pytest.raises(ValueError, match=r"task labels \[5\] have no expert"):
        oracle(None, torch.tensor([5]), expert_tasks=torch.tensor([0, 2]))


