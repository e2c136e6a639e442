"""HRM-PET's re-matching measured on the bundled digits streams: each variant of ``rematching`` on the same
trained CoLoR experts, beside the router's own choice and the oracle.

    python -m benchmarks.investigations.rematching                    # digits_class and digits_domain, seed 0
    python -m benchmarks.investigations.rematching --seeds 0 1 2 --routers prototypes gaussian

CoLoR trains once per (stream, router, seed) with the digits budget of the Makefile (the shipped digits ViT,
5 epochs, batch 32, rank 16, k 10, lr 0.05); re-matching changes evaluation only, so every variant is
evaluated on the same experts and test images (the whole test stream after the last experience). Printed per
variant: accuracy, the share of samples answered by their own experience's expert (routing accuracy), and the
share the direct step moved / the confidence step tried. The ``all-heads answer`` rows take HRM-PET's literal
answer, the best class over every expert's head on the final expert's features, instead of the final expert's
own head (CoLoR's output).
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch
from avalanche.training.plugins import EvaluationPlugin

from avalanche_color import CoLoR
from avalanche_color.backbones import offline_backbone  # "digits": the streams' 16 px ViT
from avalanche_color.benchmarks.digits import class_incremental_stream, digits_split, domain_incremental_stream
from avalanche_color.experts.routed_vit import expert_features, stacked_heads
from avalanche_color.routing.rematching import RematchingRule, pair_logits

BUDGET = dict(train_epochs=5, train_mb_size=32, rank=16, k=10, lr=0.05, eval_mb_size=256)

VARIANTS: dict[str, RematchingRule] = {
    "direct": RematchingRule("direct"),
    "hybrid, gen -10 (HRM-PET's defaults)": RematchingRule("hybrid", "gen", -10.0),
    "hybrid, gen -5": RematchingRule("hybrid", "gen", -5.0),
    "hybrid, msp 0.5": RematchingRule("hybrid", "msp", 0.5),
    "hybrid, msp 0.9": RematchingRule("hybrid", "msp", 0.9),
    "hybrid, msp 0.9, router candidate": RematchingRule("hybrid", "msp", 0.9, "router"),
    "confidence, msp 0.9": RematchingRule("confidence", "msp", 0.9),
    "confidence, msp 0.9, router candidate": RematchingRule("confidence", "msp", 0.9, "router"),
}
ALL_HEADS = ("direct", "hybrid, msp 0.9")


def streams(seed: int):
    split = digits_split(seed)
    return {"digits_class": class_incremental_stream(split), "digits_domain": domain_incremental_stream(split)}


@torch.no_grad()
def all_heads_answer(model, x: torch.Tensor, experts: torch.Tensor, class_incremental: bool) -> torch.Tensor:
    """HRM-PET's literal answer: the best class of every expert's head on ``experts``' features (class-incremental
    streams: each pair is a class; domain-incremental: the best pair's class)."""
    weight, bias, columns = stacked_heads(model.bank.heads)
    pairs = pair_logits(weight, bias, columns, expert_features(model.features, x, experts, None, model.mixed_kernel))
    best = pairs.flatten(1).argmax(1)
    return columns.flatten()[best]


@torch.no_grad()
def evaluate(model, test_stream, class_incremental: bool) -> dict[str, tuple[float, ...]]:
    x = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in test_stream])
    y = torch.cat([torch.tensor([int(s[1]) for s in e.dataset]) for e in test_stream])
    own = torch.cat([torch.full((len(e.dataset),), e.current_experience) for e in test_stream])
    routed = model.route(x)
    rows = {"off (the paper)": (model.predict(x, routed).argmax(1), routed, 0.0, 0.0)}
    for name, rule in VARIANTS.items():
        rematched = model.rematch(x, rule=rule)
        rows[name] = (rematched.logits.argmax(1), rematched.experts, float(rematched.direct.float().mean()),
                      float(rematched.low_confidence.float().mean()))
        if name in ALL_HEADS:
            rows[f"{name}, all-heads answer"] = (all_heads_answer(model, x, rematched.experts, class_incremental),
                                                 *rows[name][1:])
    rows["oracle"] = (model.predict(x, own).argmax(1), own, 0.0, 0.0)
    return {name: (float((answer == y).float().mean()), float((experts == own).float().mean()), moved, tried)
            for name, (answer, experts, moved, tried) in rows.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--routers", nargs="+", default=["prototypes", "gaussian"])
    parser.add_argument("--streams", nargs="+", default=["digits_class", "digits_domain"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # Avalanche's "no loggers" note
    for stream_name in args.streams:
        for router in args.routers:
            results: dict[str, list[tuple[float, ...]]] = {}
            for seed in args.seeds:
                benchmark = streams(seed)[stream_name]
                torch.manual_seed(seed)
                strategy = CoLoR(offline_backbone("digits"), router=router, **BUDGET, evaluator=EvaluationPlugin(loggers=[]))
                for experience in benchmark.train_stream:
                    strategy.train(experience)
                for name, measured in evaluate(strategy.model.eval(), benchmark.test_stream,
                                               stream_name == "digits_class").items():
                    results.setdefault(name, []).append(measured)
            print(f"\n{stream_name}, router {router}, seeds {args.seeds}: mean over seeds (%)\n")
            print("| variant | accuracy | own expert answers | moved by direct | tried by confidence |")
            print("|---|---|---|---|---|")
            for name, values in results.items():
                print(f"| {name} | " + " | ".join(f"{100 * statistics.mean(v[i] for v in values):.1f}"
                                                  for i in range(4)) + " |")


if __name__ == "__main__":
    main()
