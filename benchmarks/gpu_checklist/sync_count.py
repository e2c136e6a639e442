"""The GPU checklist's sync step (:mod:`benchmarks.gpu_checklist`): host syncs per training step and per evaluation
batch of every strategy of the package, on a tiny ViT (on CUDA the sync warnings, on a CPU the host reads).

    python -m benchmarks.gpu_checklist.sync_count --device cuda --out syncs.md
"""

from __future__ import annotations

import argparse
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from benchmarks.gpu_checklist import PRECISIONS, STRATEGIES


class SyncWindows:
    """Host syncs per training step and per evaluation batch (``plugin``, an Avalanche plugin).

    On CUDA it counts the warnings of ``torch.cuda.set_sync_debug_mode("warn")`` (each real sync); on a
    CPU the reads of tensors on the host that would be syncs on a GPU
    (:mod:`benchmarks.gpu_checklist.host_reads`).
    """

    def __init__(self, device: str) -> None:
        from benchmarks.gpu_checklist.host_reads import HostReads

        self.plugin = HostReads()
        self.cuda = device.startswith("cuda")

    def steps(self, kind: str) -> list[int]:
        """The syncs of each window of ``kind`` ("train" or "eval")."""
        return [sum(window.values()) for window in self.plugin.per(kind)]

    def where(self) -> Counter:
        """The syncs per place, over every window."""
        places: Counter = Counter()
        for _, window in self.plugin.counts:
            places.update({f"{what} at {place}": count for (what, place), count in window.items()})
        return places

    def run(self, body: Callable[[], None]) -> None:
        import torch

        from benchmarks.gpu_checklist.host_reads import counting

        if not self.cuda:
            with counting(self.plugin):
                body()
            return

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" in str(message):
                self.plugin.record("sync")
            else:
                original(message, category, filename, lineno, file, line)

        original = warnings.showwarning
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = show
                body()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = original


def tiny_strategies(device: str, precision: str, plugin: Any) -> dict[str, Any]:
    import torch
    from avalanche.training.plugins import EvaluationPlugin
    from timm.models.vision_transformer import VisionTransformer

    from avalanche_color import L2P, CLLoRA, CoLoR, InfLoRA, LoRASubtraction, SDLoRA, SPrompts
    from avalanche_color.evaluation.metrics import routing_accuracy_metrics

    def vit(pooling: str = "token") -> VisionTransformer:
        torch.manual_seed(0)
        return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=0,
                                 global_pool=pooling)

    common = dict(train_epochs=1, train_mb_size=16, eval_mb_size=16, device=device, precision=precision,
                  plugins=[plugin])
    evaluator = lambda: EvaluationPlugin(*routing_accuracy_metrics(), loggers=[])  # noqa: E731
    return {
        "CoLoR": lambda: CoLoR(vit(), rank=2, k=3, evaluator=evaluator(), **common),
        "CoLoR-cached": lambda: CoLoR(vit(), rank=2, k=3, cache_evaluation=True, evaluator=evaluator(),
                                                  **common),
        "S-Prompts": lambda: SPrompts(vit(), prompt_length=2, k=3, evaluator=evaluator(), **common),
        "L2P": lambda: L2P(vit(), pool_size=4, prompt_length=2, top_n=2, evaluator=evaluator(), **common),
        "SD-LoRA": lambda: SDLoRA(vit("avg"), rank=2, evaluator=evaluator(), **common),
        "InfLoRA": lambda: InfLoRA(vit("avg"), rank=2, evaluator=evaluator(), **common),
        "LoRA-Sub": lambda: LoRASubtraction(vit("avg"), rank=2, evaluator=evaluator(), **common),
        "CL-LoRA": lambda: CLLoRA(vit("avg"), rank=2, evaluator=evaluator(), **common),
    }


def tiny_stream(steps: int) -> Any:
    """Two experiences of 2 classes each, ``steps`` batches of 16 per experience, 16 px images."""
    import torch
    from avalanche.benchmarks import tensors_benchmark

    generator = torch.Generator().manual_seed(0)
    per = 16 * steps

    def experience(index: int) -> tuple:
        labels = torch.arange(2).repeat(per // 2) + 2 * index
        return torch.randn(len(labels), 3, 16, 16, generator=generator) + labels[:, None, None, None], labels

    train = [experience(i) for i in range(2)]
    test = [experience(i) for i in range(2)]
    return tensors_benchmark(train, test, task_labels=[0, 0])


def sync_counts(device: str, steps: int, strategies: tuple[str, ...] = STRATEGIES,
                precisions: Optional[tuple[str, ...]] = None) -> str:
    """The sync step's markdown: the most syncs of any training step and evaluation batch, per strategy and
    precision (``precisions``: default :data:`PRECISIONS`)."""
    rows = ["| strategy | precision | syncs per training step (most, median) | syncs per evaluation batch "
            "(most, median) | where |", "|---|---|---|---|---|"]
    for precision in precisions or PRECISIONS:
        for name in strategies:
            windows = SyncWindows(device)
            strategy = tiny_strategies(device, precision, windows.plugin)[name]()
            stream = tiny_stream(steps)

            def body() -> None:
                for experience in stream.train_stream:
                    strategy.train(experience)
                strategy.eval(stream.test_stream)
                strategy.eval(stream.test_stream)

            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="No loggers specified")
                windows.run(body)
            train, evaluation = windows.steps("train"), windows.steps("eval")
            where = ", ".join(f"{place} ({count})" for place, count in windows.where().most_common(4))
            rows.append(f"| {name} | {precision} | {max(train)}, {sorted(train)[len(train) // 2]} | "
                        f"{max(evaluation)}, {sorted(evaluation)[len(evaluation) // 2]} | {where or '-'} |")
    how = ("torch.cuda.set_sync_debug_mode('warn') warnings" if device.startswith("cuda")
           else "reads of tensors on the host (Tensor.item, __bool__, __int__, __float__, __index__, tolist): the syncs a GPU "
                "would make")
    return "\n".join([f"## Host syncs ({device})", "", f"Counted: {how}; tiny ViT (2 blocks, 32 wide, 16 px), "
                      f"batch 16, {steps} steps per experience, 2 experiences, two evaluations (CoLoR-cached: "
                      "cache_evaluation=True). On the CPU "
                      "the loss is read every step; on a GPU every 50 steps (training.data_checks).", "", *rows, ""])


def main(argv: Optional[list[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--steps", type=int, default=4, help="training steps per experience")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated, among " + ", ".join(STRATEGIES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated, among " + ", ".join(PRECISIONS))
    parser.add_argument("--out", type=Path, default=None, help="write the markdown here too")
    args = parser.parse_args(argv)
    strategies = tuple(name.strip() for name in args.strategies.split(",") if name.strip())
    precisions = tuple(name.strip() for name in args.precisions.split(",") if name.strip())
    if not strategies or set(strategies) - set(STRATEGIES):
        parser.error(f"--strategies must be among {', '.join(STRATEGIES)}, got {args.strategies!r}")
    if not precisions or set(precisions) - set(PRECISIONS):
        parser.error(f"--precisions must be among {', '.join(PRECISIONS)}, got {args.precisions!r}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    text = sync_counts(args.device, args.steps, strategies, precisions)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
