"""What better routing could give: every expert of a trained model on every test sample.

    python -m benchmarks.reporting.routing_ceiling benchmarks/results/split_tiny_imagenet_routers \\
        --method CoLoR-gaussian --seed 0

reads the run's checkpoint (the runner writes one for each run of the CoLoR family, under
``<folder>/checkpoints/``), rebuilds its test stream and backbone from ``<folder>/results.json``,
runs each expert on each test sample (one forward per expert) and prints:

* routed, routing and oracle accuracy (the run's own numbers, and the experts' strength);
* the accuracy on the samples routed right and on those routed wrong;
* the most confident expert (largest softmax maximum over all experts): can the experts tell
  their own samples apart, with no router at all?
* with a class router (``router="ridge"`` or ``"gaussian"``): the router's own class accuracy,
  and every expert's softmax weighted by the router's posterior over (expert, class) pairs, the
  best a combination of router and experts can do with one forward per expert.

A test sample's right expert is the one trained on the training experience its test
experience belongs to (as for the routing-accuracy metric).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from avalanche_color import ExpertViT, PromptExpertViT
from avalanche_color.experts.saved import restore_model_extras
from avalanche_color.experts.routed_vit import RoutedExpertViT
from avalanche_color.routing.routers import ClassRouter
from avalanche_color.training.resume import read_checkpoint
from avalanche_color.benchmarks import benchmark_spec
from avalanche_color.runner import RunConfig, build_stream, load_backbone
from avalanche_color.runner.run import slug

MODELS: dict[str, type[RoutedExpertViT]] = {"ExpertViT": ExpertViT, "PromptExpertViT": PromptExpertViT}


@torch.no_grad()
def expert_outputs(model: RoutedExpertViT, test_stream: Sequence[Any], batch_size: int = 256) -> dict[str, Tensor]:
    """Each test sample's label, right expert, routed expert and every expert's logits.

    Returns:
        ``labels`` (n,), ``right`` (n,), ``routed`` (n,), ``logits`` (n, experts, classes) and,
        with a class router, ``pair_scores`` (n, pairs).
    """
    model.eval()
    outputs: dict[str, list[Tensor]] = {"labels": [], "right": [], "routed": [], "logits": [], "pair_scores": []}
    for index, experience in enumerate(test_stream):
        for x, y, *_ in DataLoader(experience.dataset.eval(), batch_size=batch_size):
            outputs["labels"].append(torch.as_tensor(y))
            outputs["right"].append(torch.full((len(y),), index))
            outputs["routed"].append(model.route(x).cpu())
            outputs["logits"].append(torch.stack([model(x, experts=e).float().cpu()
                                                  for e in range(model.num_experts)], dim=1))
            if isinstance(model.router, ClassRouter):
                outputs["pair_scores"].append(model.router.pair_scores(model.routing_features(x)).float().cpu())
    return {name: torch.cat(parts) for name, parts in outputs.items() if parts}


def ceiling(outputs: dict[str, Tensor], pair_experts: Optional[Tensor] = None,
            pair_classes: Optional[Tensor] = None) -> dict[str, float]:
    """The report's numbers (fractions) from :func:`expert_outputs`; pairs with a class router."""
    labels, right, routed, logits = outputs["labels"], outputs["right"], outputs["routed"], outputs["logits"]
    samples = torch.arange(len(labels))

    def accuracy_with(experts: Tensor, among: Optional[Tensor] = None) -> float:
        correct = logits[samples, experts].argmax(dim=1) == labels
        correct = correct if among is None else correct[among]
        return float(correct.float().mean()) if len(correct) else float("nan")

    routed_right = routed == right
    log_probabilities = torch.log_softmax(logits, dim=2)  # -inf outside each expert's classes
    confident = log_probabilities.max(dim=2).values.argmax(dim=1)
    report = {
        "routed accuracy": accuracy_with(routed),
        "routing accuracy": float(routed_right.float().mean()),
        "oracle accuracy": accuracy_with(right),
        "accuracy, samples routed right": accuracy_with(routed, routed_right),
        "accuracy, samples routed wrong": accuracy_with(routed, ~routed_right),
        "most confident expert: routing accuracy": float((confident == right).float().mean()),
        "most confident expert: accuracy": accuracy_with(confident),
    }
    if "pair_scores" in outputs and pair_experts is not None and pair_classes is not None:
        pair_log_posterior = torch.log_softmax(outputs["pair_scores"], dim=1)
        best_pair = pair_log_posterior.argmax(dim=1)
        report["class router: class accuracy"] = float((pair_classes[best_pair] == labels).float().mean())
        # Every pair scored by the router's posterior times its expert's probability of its class.
        fused = pair_log_posterior + log_probabilities[:, pair_experts, pair_classes]
        report["router x every expert: accuracy"] = float((pair_classes[fused.argmax(dim=1)] == labels).float().mean())
    return report


def trained_model(folder: Path, method: str, seed: int) -> tuple[RoutedExpertViT, Any]:
    """The run's model, loaded from its checkpoint, and its test stream, rebuilt from ``results.json``."""
    settings = json.loads((folder / "results.json").read_text())["config"]
    config = RunConfig(benchmark=settings["benchmark"], data=settings.get("data"),
                              train_per_class=settings.get("train_per_class"),
                              normalisation=settings.get("normalisation", "backbone"))
    spec = benchmark_spec(config.benchmark)
    backbone = load_backbone(settings.get("backbone") or spec.backbone, architecture=settings.get("architecture"))
    path = folder / "checkpoints" / f"{slug(method)}_seed{seed}.ckpt"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint {str(path)!r}: the runner writes one per run of the CoLoR family "
                                f"(run the comparison that made {str(folder)!r} on this machine first)")
    checkpoint = read_checkpoint(path)
    model_settings = dict(checkpoint.settings)
    model_class = MODELS[model_settings.pop("model")]
    model = model_class(backbone, **{name: value for name, value in model_settings.items() if value is not None})
    model.load_experts_state_dict(checkpoint.experts)
    restore_model_extras(model, checkpoint.model_extras)
    return model, build_stream(spec, config, backbone, seed, task_labels=False).test_stream


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a comparison's output folder (results.json, checkpoints/)")
    parser.add_argument("--method", required=True, help="a CoLoR-family method of that comparison")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model, test_stream = trained_model(args.folder, args.method, args.seed)
    router = model.router if isinstance(model.router, ClassRouter) else None
    report = ceiling(expert_outputs(model, test_stream), *(() if router is None else
                                                          (router.pair_experts, router.pair_classes)))
    for name, value in report.items():
        print(f"{name:45s} {100 * value:5.1f}")


if __name__ == "__main__":
    main()
