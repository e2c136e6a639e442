"""Top-m routing measured: its cost per test image against m, and its rules' accuracy on tiny seeded streams.

    python -m benchmarks.perf.top_m cost                  # ViT-B/16 shape, 10 experts, CPU (CUDA when present)
    python -m benchmarks.perf.top_m cost --model vit_tiny_patch16_224 --threads 1
    python -m benchmarks.perf.top_m rules                 # the rules on the tests' tiny streams (minutes on a CPU)

``cost`` times, interleaved in one process on the same batch (:mod:`benchmarks.perf.timing`), a plain ViT
forward and CoLoR's routed evaluation forward with ``top_m`` = 1, 2, 3 and 5 and with ``rematching="hybrid"``,
and prints each as seconds per image and as ratios side by side: to m = 1, and to the plain forward. The ideal,
one routing pass and m expert passes: (1 + m) / 2 times m = 1's cost, 1 + m plain forwards; re-matching's, one
routing pass, one expert pass, and one more for the share of samples the direct step moves (d) and for the
share the confidence step tries (c): (2 + d + c) / 2 and 2 + d + c. The model's experts have random weights, so
their heads disagree at random and d and c are near their worst.

``rules`` trains tiny CoLoR (the tests' seeded 2-block ViT and streams, ``tests/streams.py``) once per seed,
stream and router, and evaluates the trained model with m = 1 and with each rule of ``top_m_rule`` (and the entropy rule,
measured and left out) at m = 2 and 3 (the experts train as CoLoR's whatever m is, so one training serves every m and rule), beside the
oracle (each sample's own expert): the test accuracy and the share of samples answered by their own
experience's expert.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import timm
import torch

from avalanche_color.color.config import CANDIDATE_RULES, LoRAOptions
from avalanche_color.experts.routed_vit import Candidates
from benchmarks.perf.timing import Variant, interleaved, machine, per_round
from benchmarks.perf.workloads import CLASSES, build_color

MS = (1, 2, 3, 5)


# ---------------------------------------------------------------------- the cost per test image against m

def cost(args: argparse.Namespace) -> None:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    vit = timm.create_model(args.model, pretrained=False, num_classes=0).to(device).eval()
    model = build_color(timm.create_model(args.model, pretrained=False, num_classes=0), args.experts, args.rank,
                        CLASSES, k=5, device=device).eval()
    size = vit.patch_embed.img_size
    x = torch.randn(args.batch_size, 3, *size, generator=torch.Generator().manual_seed(0)).to(device)
    configs: dict[object, LoRAOptions] = {m: LoRAOptions.build(model.config, top_m=m) for m in MS}
    # HRM-PET's re-matching: one expert pass more for the samples its steps move or try, a share that depends on
    # the experts (measured here on this batch, then timed as the evaluation forward).
    configs["rematch"] = LoRAOptions.build(model.config, rematching="hybrid")
    model.config = configs["rematch"]
    with torch.inference_mode():
        rematched = model.rematch(x)
    moved, tried = (rematched.direct.float().mean().item(), rematched.low_confidence.float().mean().item())

    def evaluated_with(key: object):
        def run() -> None:
            model.config = configs[key]
            model(x)
        return run

    variants = {"plain": Variant(lambda: vit(x))} | {f"m={m}": Variant(evaluated_with(m)) for m in MS}
    variants["rematch"] = Variant(evaluated_with("rematch"))
    with torch.inference_mode():
        rounds = interleaved(variants, args.rounds, device)

    def measured(name: str) -> list[str]:
        """Milliseconds per image, and the time over m = 1's and over the plain forward's, each as a cell."""
        ratios = (per_round(rounds, lambda t: 1000 * t[name] / args.batch_size),
                  per_round(rounds, lambda t: t[name] / t["m=1"]), per_round(rounds, lambda t: t[name] / t["plain"]))
        return [ratio.format(2) for ratio in ratios]

    print(f"\n{args.model}, batch {args.batch_size}, {args.experts} experts, rank {args.rank}, on {machine(device)}; "
          f"median (min-max) over {args.rounds} rounds\n")
    print("| m | ms per image | / m = 1 | ideal (1 + m) / 2 | / plain forward | ideal 1 + m |")
    print("|---|---|---|---|---|---|")
    for m in MS:
        per_image, to_one, to_plain = measured(f"m={m}")
        print(f"| {m} | {per_image} | {to_one} | {(1 + m) / 2:.1f} | {to_plain} | {1 + m} |")
    per_image, to_one, to_plain = measured("rematch")
    passes = 2 + moved + tried  # the routing pass, the routed expert's, the moved samples' and the tried ones'
    print(f"| re-matching (hybrid): {100 * moved:.0f}% moved, {100 * tried:.0f}% tried | {per_image} | {to_one} | "
          f"{passes / 2:.2f} | {to_plain} | {passes:.2f} |")


# ---------------------------------------------------------------------- the rules on the tests' tiny streams

def rules(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from helpers import tiny_color  # the tests' tiny CoLoR: rank 4, k 3, batches of 16
    from streams import class_stream, domain_stream

    torch.set_num_threads(args.threads or 1)
    warnings.filterwarnings("ignore")  # Avalanche's "no loggers", and tiny experts' learned-nothing notes
    streams = {
        "class (4 x 2 classes)": lambda seed: class_stream(num_experiences=4, seed=seed),
        f"domain (4 domains, shift {args.shift})": lambda seed: domain_stream(num_domains=4, shift=args.shift,
                                                                             seed=seed),
    }
    columns = ["m=1", *(f"{rule} m={m}" for m in (2, 3) for rule in (*CANDIDATE_RULES, "entropy")), "oracle"]
    for router in args.routers:
        for stream_name, make in streams.items():
            results: dict[str, list[tuple[float, float]]] = {column: [] for column in columns}
            for seed in args.seeds:
                benchmark = make(seed)
                strategy = tiny_color(seed, router=router, train_epochs=args.epochs, lr=args.lr)
                for experience in benchmark.train_stream:
                    strategy.train(experience)
                for column, measured in evaluate(strategy.model.eval(), benchmark.test_stream).items():
                    results[column].append(measured)
            print(f"\n{router} router, {stream_name} stream, seeds {args.seeds}, {args.epochs} epochs: "
                  f"accuracy / own expert answers (%), mean over seeds\n")
            print("| " + " | ".join(columns) + " |")
            print("|" + "---|" * len(columns))
            print("| " + " | ".join(f"{100 * statistics.mean(a for a, _ in results[c]):.1f} / "
                                    f"{100 * statistics.mean(r for _, r in results[c]):.1f}" for c in columns) + " |")


@torch.no_grad()
def evaluate(model, test_stream) -> dict[str, tuple[float, float]]:
    """Accuracy and the share answered by the sample's own experience's expert, of m = 1, each rule at m = 2
    and 3, and the oracle (each sample's own expert)."""
    x = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in test_stream])
    y = torch.cat([torch.tensor([int(s[1]) for s in e.dataset]) for e in test_stream])
    own = torch.cat([torch.full((len(e.dataset),), e.current_experience) for e in test_stream])
    routed = model.route(x)
    measured = {"m=1": (model.predict(x, routed), routed)}
    for m in (2, 3):
        candidates = model.propose(x, m=m)
        for rule in CANDIDATE_RULES:
            measured[f"{rule} m={m}"] = candidates.pick(rule)
        measured[f"entropy m={m}"] = least_entropy(candidates)
    measured["oracle"] = (model.predict(x, own), own)
    return {name: (float((logits.argmax(1) == y).float().mean()), float((experts == own).float().mean()))
            for name, (logits, experts) in measured.items()}


def least_entropy(candidates: Candidates) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule measured and left out of ``top_m_rule``: the candidate whose softmax has the least entropy."""
    merit = -torch.special.entr(candidates.logits.softmax(dim=-1)).sum(dim=-1)
    choice = merit.argmax(dim=1)
    rows = torch.arange(len(choice))
    return candidates.logits[rows, choice], candidates.experts[rows, choice]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("cost", "rules"),
                        help="cost: time per test image against m, as ratios side by side; rules: the rules' "
                             "accuracy on the tests' tiny seeded streams")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (rules: 1 by default)")
    timed = parser.add_argument_group("cost")
    timed.add_argument("--model", default="vit_base_patch16_224")
    timed.add_argument("--device", default=None)
    timed.add_argument("--batch-size", type=int, default=32)
    timed.add_argument("--experts", type=int, default=10)
    timed.add_argument("--rank", type=int, default=8)
    timed.add_argument("--rounds", type=int, default=5)
    measured = parser.add_argument_group("rules")
    measured.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    measured.add_argument("--epochs", type=int, default=4)
    measured.add_argument("--lr", type=float, default=0.05)
    measured.add_argument("--shift", type=float, default=0.25, help="the domains' offset: lower, harder to route")
    measured.add_argument("--routers", nargs="+", default=["prototypes", "gaussian"])
    args = parser.parse_args(argv)
    cost(args) if args.command == "cost" else rules(args)


if __name__ == "__main__":
    main()
