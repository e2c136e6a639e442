"""The first 30 minutes on a GPU: everything the CPU cannot tell, run in one command.

    python -m benchmarks.gpu_checklist --device cuda              # everything (2 GPUs for the torchrun step)
    python -m benchmarks.gpu_checklist --device cuda --dry-run    # the commands, and the sync count only
    python -m benchmarks.gpu_checklist --device cpu --dry-run     # the same on a CPU (what the tests run)

Steps, each written to ``--out`` (``benchmarks/results/gpu-checklist/`` by default) and summed up in
``checklist.md`` there:

1. ``perf-32-true.md``, ``perf-bf16-mixed.md``: ``benchmarks.perf``'s table (images per second of
   training and routed inference, the ratios R1-R5, memory, loader rates) in float32 and under
   bfloat16 autocast (what ``precision="bf16-mixed"`` runs).
2. ``syncs.md``: host syncs per training step and per evaluation batch of every strategy of the
   package, on a tiny ViT: on CUDA the warnings of ``torch.cuda.set_sync_debug_mode("warn")``, on a
   CPU the reads of device tensors (``Tensor.item``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``,
   ``tolist``) that would be syncs on a GPU.
3. ``torchrun.md``: the runner on 2 GPUs with NCCL (``torchrun --nproc_per_node=2``) against one
   process, on the digits stream: average accuracy within 0.05, and wall time.
4. ``cuda-tests.txt``: ``pytest -m cuda``, the tests marked for CUDA (skipped on machines without it).

``--dry-run`` prints every step's command and runs step 2 only, on tiny settings.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from benchmarks.sync_count import PRECISIONS, STRATEGIES, sync_counts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu-checklist"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    parser.add_argument("--dry-run", action="store_true", help="print every step's command; run the sync count only")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the folder the step files and checklist.md go to")
    parser.add_argument("--perf-args", default="--batch-size 64",
                        help="extra options of benchmarks.perf (quoted), e.g. '--batch-size 64 --rounds 3'")
    parser.add_argument("--sync-steps", type=int, default=4, help="training steps per experience of the sync count")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated strategies of the sync count (default: all, {', '.join(STRATEGIES)})")
    args = parser.parse_args(argv)
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        parser.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    args.strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    unknown = sorted(set(args.strategies) - set(STRATEGIES))
    if unknown or not args.strategies:
        parser.error(f"--strategies must be among {', '.join(STRATEGIES)}, got {unknown or 'none'}")
    if args.sync_steps < 1:
        parser.error(f"--sync-steps must be >= 1, got {args.sync_steps}")
    return args


# ---------------------------------------------------------------------- the commands


def perf_command(device: str, precision: str, out: Path, extra: str) -> list[str]:
    command = [sys.executable, "-m", "benchmarks.perf", "--device", device, *shlex.split(extra),
               "--out", str(out / f"perf-{precision}.md")]
    return command + (["--bf16"] if precision == "bf16-mixed" else [])


def runner_command(out: Path, processes: int, batch_size: int) -> list[str]:
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
              if processes > 1 else [sys.executable])
    return [*launch, "-m", "avalanche_color.runner", "compare", "--benchmark", "digits_class", "--methods", "CoLoR",
            "--epochs", "1", "--batch-size", str(batch_size), "--rank", "4", "--loggers",
            "--out-dir", str(out / "torchrun"), "--name", f"{processes}-process"]


def cuda_tests_command() -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")]


def shown(command: list[str], env: Optional[dict[str, str]] = None) -> str:
    prefix = " ".join(f"{name}={value}" for name, value in (env or {}).items())
    return (prefix + " " if prefix else "") + shlex.join(command)


# ---------------------------------------------------------------------- the steps


def run_logged(command: list[str], log: Path, env: Optional[dict[str, str]] = None, timeout: int = 3600) -> int:
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                               timeout=timeout)
    log.write_text(f"$ {shown(command, env)}\n# exit {completed.returncode}, {time.perf_counter() - start:.0f} s\n"
                   f"{completed.stdout}\n{completed.stderr}")
    return completed.returncode


def torchrun_section(out: Path, dry_run: bool, gpus: int) -> tuple[str, list[str]]:
    two = runner_command(out, 2, 32)
    one = runner_command(out, 1, 64)
    env = {"AVALANCHE_COLOR_BACKEND": "nccl"}
    commands = [shown(two, env), shown(one)]
    if dry_run or gpus < 2:
        reason = "dry run" if dry_run else f"needs 2 GPUs, found {gpus}"
        return f"## Runner under torchrun (NCCL, 2 GPUs) against one process\n\nNot run ({reason}).\n", commands
    walls, accuracies = {}, {}
    for label, command, command_env in (("2 processes (NCCL)", two, env), ("1 process", one, None)):
        start = time.perf_counter()
        code = run_logged(command, out / f"torchrun-{label.split()[0]}.log", command_env)
        walls[label] = time.perf_counter() - start
        folder = out / "torchrun" / f"{label.split()[0]}-process"
        if code == 0:
            accuracies[label] = json.loads((folder / "results.json").read_text())["runs"][0]["average_accuracy"]
    lines = ["## Runner under torchrun (NCCL, 2 GPUs) against one process", "",
             "| run | average accuracy | wall time (s) |", "|---|---|---|"]
    lines += [f"| {label} | {accuracies.get(label, 'failed (see its log)')} | {walls[label]:.0f} |" for label in walls]
    if len(accuracies) == 2:
        gap = abs(accuracies["2 processes (NCCL)"] - accuracies["1 process"])
        lines += ["", f"Accuracy gap {gap:.3f} ({'within' if gap <= 0.05 else 'OUTSIDE'} 0.05)."]
    return "\n".join(lines) + "\n", commands


def main(argv: Optional[list[str]] = None) -> str:
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    import torch

    cuda = args.device.startswith("cuda")
    gpus = torch.cuda.device_count() if cuda else 0
    sections = [f"# GPU checklist ({args.device}{', dry run' if args.dry_run else ''})", "",
                f"torch {torch.__version__}; "
                + (f"{gpus} x {torch.cuda.get_device_name(0)}" if gpus else "no GPU used") + ".", ""]
    commands: list[str] = []

    # 1. the perf table in float32 and bf16-mixed
    perf = {precision: perf_command(args.device, precision, out, args.perf_args) for precision in PRECISIONS}
    commands += [shown(command) for command in perf.values()]
    sections.append("## Performance (benchmarks.perf)\n")
    for precision, command in perf.items():
        if args.dry_run:
            sections.append(f"* {precision}: not run (dry run)")
        else:
            code = run_logged(command, out / f"perf-{precision}.log")
            sections.append(f"* {precision}: " + (f"[perf-{precision}.md](perf-{precision}.md)" if code == 0
                                                  else f"failed (exit {code}, see perf-{precision}.log)"))
    sections.append("")

    # 2. host syncs
    syncs = sync_counts(args.device, 1 if args.dry_run else args.sync_steps, tuple(args.strategies))
    (out / "syncs.md").write_text(syncs)
    commands.append(shown([sys.executable, "-m", "benchmarks.gpu_checklist", "--device", args.device, "--dry-run"])
                    + "  # step 2 alone")
    sections.append(syncs)

    # 3. torchrun with NCCL against one process
    text, torchrun_commands = torchrun_section(out, args.dry_run, gpus)
    commands += torchrun_commands
    sections.append(text)

    # 4. the CUDA-marked tests
    tests = cuda_tests_command()
    commands.append(shown(tests))
    if args.dry_run or not cuda:
        sections.append("## CUDA-marked tests (pytest -m cuda)\n\nNot run (" + ("dry run" if args.dry_run else "no GPU")
                        + ").\n")
    else:
        code = run_logged(tests, out / "cuda-tests.txt")
        tail = (out / "cuda-tests.txt").read_text().strip().splitlines()[-1:]
        sections.append(f"## CUDA-marked tests (pytest -m cuda)\n\nexit {code}: {' '.join(tail)} "
                        "([cuda-tests.txt](cuda-tests.txt)).\n")

    sections += ["## Commands", "", "```bash", *commands, "```", ""]
    text = "\n".join(sections)
    (out / "checklist.md").write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
