"""The first run on a GPU: everything the CPU cannot tell, in one command of about 7 minutes on one H100.

    python -m benchmarks.gpu_checklist --device cuda --wheelhouse wheelhouse --data PACS.zip
    python -m benchmarks.gpu_checklist --device cpu --dry-run     # every command built and checked (the tests)

Steps, in this order, each with a time limit, logged to ``--out`` (``gpu-checklist/`` by default):

1. ``install``: with ``--wheelhouse``, the offline install of :mod:`benchmarks.wheelhouse` into this Python's
   environment, against the torch already there (skipped without it).
2. ``environment``: Python, torch, CUDA, cuDNN, the GPU, the package versions.
3. ``cuda-tests``: ``pytest -m cuda``, the tests marked for CUDA.
4. ``syncs``: host syncs per training step and per evaluation batch of every strategy, on a tiny ViT, in
   float32 and bf16-mixed (on CUDA ``torch.cuda.set_sync_debug_mode("warn")``, on a CPU the host reads of
   :mod:`benchmarks.gpu_checklist.host_reads`; :mod:`benchmarks.gpu_checklist.sync_count`).
5. ``perf``: R1 (``benchmarks.perf.step``), R3 and R4 (``benchmarks.perf --only kernels``) in fp32, TF32
   (``--matmul-precision high``) and bf16-mixed, and training memory against 1, 10 and 50 experiences
   (``--only memory``) in fp32 and bf16-mixed (TF32 stores the same tensors as fp32).
6. ``pacs``: CoLoR and SD-LoRA trained on PACS with the ImageNet ViT-Ti (``--backbone``, a file found in
   ``AVALANCHE_COLOR_MODELS``; 112 px) in 32-true and bf16-mixed, accuracy side by side.
7. ``torchrun``: the runner on 2 GPUs with NCCL against one process (only where there are 2 GPUs).

``checklist.md`` sums them up (each step's time against its limit, every command), and ``gpu-checklist.tar.gz``
beside the folder holds the folder. ``--dry-run`` builds every command, checks each one's flags against its
``--help``, runs the sync count on one strategy for one step, and writes the summary and the archive.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
OUT = Path("gpu-checklist")
# (label, precision, matmul precision): the perf table's three settings.
PERF_VARIANTS = (("fp32", "32-true", "highest"), ("tf32", "32-true", "high"), ("bf16", "bf16-mixed", "highest"))
# The sync step's precisions and strategies: :mod:`benchmarks.gpu_checklist.sync_count` takes them from here, so
# that this package never imports it before ``python -m`` runs it.
PRECISIONS = ("32-true", "bf16-mixed")
STRATEGIES = ("CoLoR", "CoLoR-cached", "S-Prompts", "L2P", "SD-LoRA", "InfLoRA", "LoRA-Sub", "CL-LoRA")
PACS_PRECISIONS = ("32-true", "bf16-mixed")
PACS_METHODS = ("CoLoR", "SD-LoRA")
# Seconds each step may take on the GPU (the run's limit, about 7 minutes in all; the estimate is on the
# GPU checklist page). A step past its limit is stopped and reported, and the run goes on.
LIMITS = {"install": 90, "environment": 15, "cuda-tests": 40, "syncs": 45, "perf": 140, "pacs": 90,
          "torchrun": 180}


@dataclass
class Step:
    name: str
    commands: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: Optional[Path] = None  # where the commands run: the folder the checklist runs from unless given
    seconds: float = 0.0
    status: str = "not run"
    text: str = ""


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_checklist", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda (default where there is one), cuda:N or cpu")
    parser.add_argument("--dry-run", action="store_true",
                        help="build every command and check its flags; run the sync count on one strategy only")
    parser.add_argument("--out", type=Path, default=OUT, help="the folder of the step files and checklist.md")
    parser.add_argument("--wheelhouse", type=Path, default=None,
                        help="install the package from this folder first (python -m benchmarks.wheelhouse build)")
    parser.add_argument("--backbone", default="vit_tiny_patch16_224-imagenet.safetensors",
                        help="the ViT-Ti weights file of the PACS step (a name is looked for in AVALANCHE_COLOR_MODELS)")
    parser.add_argument("--architecture", default="vit_tiny_patch16_224", help="the timm model of --backbone")
    parser.add_argument("--image-size", type=int, default=112, help="input size of the PACS step's ViT")
    parser.add_argument("--data", type=Path, default=None,
                        help="the PACS zip (default: the runner's, in AVALANCHE_COLOR_DATA)")
    parser.add_argument("--pacs-args", default="--epochs 3 --train-per-class 100 --batch-size 64",
                        help="the PACS step's budget (runner options, quoted)")
    parser.add_argument("--perf-args", default="--batch-size 64 --rounds 3",
                        help="options of benchmarks.perf.step and benchmarks.perf's kernel rows (quoted)")
    parser.add_argument("--sync-steps", type=int, default=4, help="training steps per experience of the sync count")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated strategies of the sync count (default: all, {', '.join(STRATEGIES)})")
    args = parser.parse_args(argv)
    if args.device is not None and args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        parser.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    args.strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    unknown = sorted(set(args.strategies) - set(STRATEGIES))
    if unknown or not args.strategies:
        parser.error(f"--strategies must be among {', '.join(STRATEGIES)}, got {unknown or 'none'}")
    if args.sync_steps < 1:
        parser.error(f"--sync-steps must be >= 1, got {args.sync_steps}")
    if args.wheelhouse is not None and not (args.wheelhouse / "requirements.txt").is_file():
        parser.error(f"--wheelhouse {args.wheelhouse} holds no requirements.txt (make wheelhouse builds one)")
    return args


# ---------------------------------------------------------------------- the commands


def python(*arguments: str) -> list[str]:
    return [sys.executable, *arguments]


def perf_commands(device: str, out: Path, extra: str) -> list[list[str]]:
    """R1, then R3 and R4, in each of :data:`PERF_VARIANTS`; then the memory rows in fp32 and bf16."""
    commands = []
    for label, precision, matmul in PERF_VARIANTS:
        flags = ["--device", device, "--matmul-precision", matmul] + (["--bf16"] if precision == "bf16-mixed" else [])
        commands.append(python("-m", "benchmarks.perf.step", *flags, *shlex.split(extra), "--experts", "50"))
        commands.append(python("-m", "benchmarks.perf", "--only", "kernels", *flags, *shlex.split(extra),
                               "--out", str(out / f"perf-{label}.md")))
    for label, precision, matmul in PERF_VARIANTS:
        if matmul == "highest":
            commands.append(python("-m", "benchmarks.perf", "--only", "memory", "--device", device,
                                   *(["--bf16"] if precision == "bf16-mixed" else []),
                                   "--out", str(out / f"perf-{label}.md")))
    return commands


def sync_command(device: str, out: Path, steps: int, strategies: list[str], precisions: tuple[str, ...]
                 ) -> list[str]:
    return python("-m", "benchmarks.gpu_checklist.sync_count", "--device", device, "--steps", str(steps),
                  "--strategies", ",".join(strategies), "--precisions", ",".join(precisions),
                  "--out", str(out / "syncs.md"))


def pacs_commands(args: argparse.Namespace, device: str, out: Path) -> list[list[str]]:
    data = ["--data", str(args.data)] if args.data is not None else []
    return [python("-m", "avalanche_color.runner", "compare", "--benchmark", "pacs", "--methods", *PACS_METHODS,
                   "--backbone", args.backbone, "--architecture", args.architecture, "--image-size",
                   str(args.image_size), *data, *shlex.split(args.pacs_args), "--device", device, "--precision",
                   precision, "--loggers", "--quiet", "--out-dir", str(out / "pacs"), "--name", precision)
            for precision in PACS_PRECISIONS]


def torchrun_commands(out: Path) -> list[list[str]]:
    common = ["-m", "avalanche_color.runner", "compare", "--benchmark", "digits_class", "--methods", "CoLoR",
              "--epochs", "1", "--rank", "4", "--loggers", "--quiet", "--out-dir", str(out / "torchrun")]
    return [python("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *common, "--batch-size", "32",
                   "--name", "2-process"),
            python(*common, "--batch-size", "64", "--name", "1-process")]


def shown(command: list[str], env: Optional[dict[str, str]] = None) -> str:
    """``command`` as a shell line, ``python`` for this interpreter (its folders are those the user gave)."""
    prefix = " ".join(f"{name}={value}" for name, value in (env or {}).items())
    words = ["python" if word == sys.executable else word for word in command]
    return (prefix + " " if prefix else "") + shlex.join(words)


# ---------------------------------------------------------------------- running and checking them


def run_logged(command: list[str], log: Path, timeout: float, env: Optional[dict[str, str]] = None,
               cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """Run ``command`` in ``cwd`` (default: here) with the repository on the path, its output appended to
    ``log``; a timeout is exit 124."""
    start = time.perf_counter()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    try:
        done = subprocess.run(command, cwd=cwd, env={**os.environ, "PYTHONPATH": path, **(env or {})},
                              capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired as stopped:
        done = subprocess.CompletedProcess(command, 124, str(stopped.stdout or ""), f"stopped after {timeout:.0f} s")
    with log.open("a") as file:
        file.write(f"$ {shown(command, env)}\n# exit {done.returncode}, {time.perf_counter() - start:.0f} s\n"
                   f"{done.stdout}\n{done.stderr}\n")
    return done


HELP = """
import contextlib, io, runpy, sys
for target in sys.argv[1:]:
    module, *subcommand = target.split("/")
    sys.argv = [module, *subcommand, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
    print(f"<<< {target} >>>")
    print(out.getvalue())
"""


def command_flags(command: list[str]) -> Optional[tuple[str, list[str]]]:
    """The module a command runs (``module/subcommand`` where it has one) and the flags it gives it; None for
    pytest (its markers are not flags of ours)."""
    starts = [index for index, word in enumerate(command) if word == "-m"]
    if not starts:
        return None
    at = starts[0] + 1
    if command[at] == "torch.distributed.run":
        at = starts[1] + 1
    module, rest = command[at], command[at + 1:]
    if module == "pytest":
        return None
    if rest and not rest[0].startswith("-"):
        module, rest = f"{module}/{rest[0]}", rest[1:]
    return module, [word.split("=")[0] for word in rest if word.startswith("--")]


def help_texts(modules: Iterable[str], env: Optional[dict[str, str]] = None
               ) -> tuple[dict[str, str], subprocess.CompletedProcess]:
    """Each module's ``--help`` (``module/subcommand``: that subcommand's), printed by one Python process run
    from the repository with ``env`` over this one's; and that process (its return code, its stderr)."""
    run = subprocess.run([sys.executable, "-c", HELP, *sorted(modules)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return dict(re.findall(r"<<< ([\w./]+) >>>\n(.*?)(?=<<< |\Z)", run.stdout, flags=re.DOTALL)), run


def missing_flags(used: dict[str, set[str]], helps: dict[str, str]) -> dict[str, list[str]]:
    """The flags of ``used`` (module -> flags) that the module's help text does not name (empty: all exist)."""
    missing = {module: sorted(flag for flag in flags
                              if not re.search(rf"(?<![\w-]){flag}(?![\w-])", helps.get(module, "")))
               for module, flags in used.items()}
    return {module: flags for module, flags in missing.items() if flags}


def unknown_flags(commands: list[list[str]]) -> dict[str, list[str]]:
    """The flags of ``commands`` that their module's ``--help`` does not name (empty: every flag exists)."""
    used: dict[str, set[str]] = {}
    for found in filter(None, map(command_flags, commands)):
        used.setdefault(found[0], set()).update(found[1])
    return missing_flags(used, help_texts(used)[0])


# ---------------------------------------------------------------------- the steps


def environment_text(device: str) -> str:
    import torch

    import avalanche_color

    versions = {}
    for name in ("avalanche-lib", "timm", "numpy", "scikit-learn"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version
            versions[name] = version(name)
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    lines = [f"* Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs",
             f"* torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
             f"{torch.backends.cudnn.version() if cuda else '-'}); avalanche_color {avalanche_color.__version__}; "
             + ", ".join(f"{name} {value}" for name, value in versions.items())]
    if cuda:
        properties = torch.cuda.get_device_properties(0)
        lines.append(f"* {torch.cuda.device_count()} x {properties.name}, {properties.total_memory / 2**30:.0f} GiB, "
                     f"compute capability {properties.major}.{properties.minor}; TF32 matmuls possible: "
                     f"{properties.major >= 8}")
    else:
        lines.append("* no GPU used")
    return "\n".join(lines)


def kernel_cells(table: str, row: str) -> str:
    """A row (R3, R4) of a kernels section: each kernel's value, named by the section's header."""
    header = re.search(r"^\| row \| what \| (.+) \| target \|$", table, flags=re.M)
    found = re.search(rf"^\| {row} \|[^|]*\|(.+)\|[^|]*\|$", table, flags=re.M)
    if not (header and found):
        return "-"
    names = [name.strip() for name in header.group(1).split("|")]
    return ", ".join(f"{name} {value.strip()}" for name, value in zip(names, found.group(1).split("|")))


def perf_text(out: Path) -> str:
    """R1 of each setting (from ``perf.log``), R3 and R4 (from its kernel rows, per kernel), as one table."""
    log = (out / "perf.log").read_text() if (out / "perf.log").exists() else ""
    r1 = {}
    for kind, matmul, value in re.findall(r"(bf16 autocast|float32), matmul precision (\w+)\n"
                                          r"R1 \(CoLoR training step / frozen-backbone forward\): ([^\n]+)", log):
        r1["bf16" if kind == "bf16 autocast" else ("tf32" if matmul == "high" else "fp32")] = value.strip()
    lines = ["| setting | R1 (step / forward) | R3 | R4 | file |", "|---|---|---|---|---|"]
    for label, precision, matmul in PERF_VARIANTS:
        file = out / f"perf-{label}.md"
        table = file.read_text() if file.exists() else ""
        lines.append(f"| {label} ({precision}, matmul {matmul}) | {r1.get(label, '-')} | {kernel_cells(table, 'R3')} | "
                     f"{kernel_cells(table, 'R4')} | [perf-{label}.md](perf-{label}.md) |")
    return "\n".join(lines)


def pacs_text(out: Path) -> str:
    accuracy: dict[str, dict[str, str]] = {}
    for precision in PACS_PRECISIONS:
        results = out / "pacs" / precision / "results.json"
        if results.exists():
            for run in json.loads(results.read_text())["runs"]:
                accuracy.setdefault(run["label"], {})[precision] = (
                    f"{run['average_accuracy']:.3f} ({run['wall_seconds']:.0f} s)")
    lines = ["| method | " + " | ".join(f"{p}: average accuracy (wall)" for p in PACS_PRECISIONS) + " |",
             "|---|" + "---|" * len(PACS_PRECISIONS)]
    for label in PACS_METHODS:
        lines.append(f"| {label} | " + " | ".join(accuracy.get(label, {}).get(p, "-") for p in PACS_PRECISIONS) + " |")
    return "\n".join(lines)


def archive(out: Path) -> Path:
    """``<out>.tar.gz`` beside ``out``, holding it."""
    path = out.parent / f"{out.name}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    return path


def main(argv: Optional[list[str]] = None) -> str:
    args = parse_args(argv)
    out: Path = args.out  # as given: the commands run from here and name it so
    out.mkdir(parents=True, exist_ok=True)
    for log in out.glob("*.log"):
        log.unlink()
    started = time.perf_counter()
    steps: list[Step] = []

    install = Step("install")
    if args.wheelhouse is not None:
        install.commands = [python("-m", "benchmarks.wheelhouse", "install", "--wheelhouse", str(args.wheelhouse))]
    steps.append(install)
    if args.wheelhouse is not None and not args.dry_run:
        run_step(install, out)
        importlib.invalidate_caches()  # what the install brought is imported below
    elif args.wheelhouse is None:
        install.status = "skipped (no --wheelhouse)"

    import torch  # after the install, which may have brought what torch's users need

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    gpus = torch.cuda.device_count() if cuda else 0
    if cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    environment = Step("environment")
    steps.append(environment)
    run_step(environment, out, lambda: environment_text(device))

    tests = Step("cuda-tests", [python("-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "tests")],
                 cwd=ROOT)
    syncs = Step("syncs", [sync_command(device, out, args.sync_steps, args.strategies, PRECISIONS)])
    perf = Step("perf", perf_commands(device, out, args.perf_args))
    pacs = Step("pacs", pacs_commands(args, device, out))
    torchrun = Step("torchrun", torchrun_commands(out), {"AVALANCHE_COLOR_BACKEND": "nccl"})
    steps += [tests, syncs, perf, pacs, torchrun]

    if args.dry_run:
        missing = unknown_flags([command for step in steps for command in step.commands])
        for step in (install, tests, perf, pacs, torchrun):
            if step.commands:
                step.status = "dry run: flags checked" if not missing else f"dry run: unknown flags {missing}"
        syncs.commands = [sync_command(device, out, 1, args.strategies[:1], PRECISIONS[:1])]  # the same, smaller
        run_step(syncs, out)
    else:
        for step in (tests, syncs, perf, pacs):
            if step is tests and not cuda:
                step.status = "skipped (no GPU)"
                continue
            run_step(step, out)
        if gpus >= 2:
            run_step(torchrun, out)
        else:
            torchrun.status = f"skipped (needs 2 GPUs, found {gpus})"
    syncs.text = (out / "syncs.md").read_text() if (out / "syncs.md").exists() else "## Host syncs\n\nNot counted."
    perf.text, pacs.text = perf_text(out), pacs_text(out)
    if tests.status.startswith("exit"):
        tail = (out / "cuda-tests.log").read_text().strip().splitlines()
        tests.text = next((line for line in reversed(tail) if " in " in line and ("passed" in line or "skipped" in line
                                                                                  or "failed" in line)), "")

    text = summary(args, device, steps, time.perf_counter() - started)
    (out / "checklist.md").write_text(text)
    archive(out)
    print(text)
    return text


def run_step(step: Step, out: Path, body=None) -> None:
    """Run ``step``'s commands (or ``body``, in this process) within its limit; record status, time and text."""
    start = time.perf_counter()
    limit = LIMITS[step.name]
    codes = []
    if body is None:
        log = out / f"{step.name}.log"
        for command in step.commands:
            left = limit - (time.perf_counter() - start)
            codes.append(run_logged(command, log.resolve(), left, step.env, step.cwd).returncode if left > 0 else 124)
        failed = [code for code in codes if code != 0]
        step.status = "exit 0" if not failed else f"exit {failed[0]} ({len(failed)} of {len(codes)} commands failed, " \
                                                  f"see {step.name}.log)"
    else:
        try:
            step.text = body() or ""
            step.status = "done"
        except Exception as error:  # reported in the summary; the other steps go on
            step.status = f"failed: {type(error).__name__}: {error}"
    step.seconds = time.perf_counter() - start


def summary(args: argparse.Namespace, device: str, steps: list[Step], seconds: float) -> str:
    by = {step.name: step for step in steps}
    lines = [f"# GPU checklist ({device}{', dry run' if args.dry_run else ''})", "",
             f"{seconds:.0f} s in all (the steps' limits: {sum(LIMITS.values()) - LIMITS['torchrun']} s without "
             "torchrun).", "",
             "| step | status | seconds | limit |", "|---|---|---|---|"]
    lines += [f"| {step.name} | {step.status} | {step.seconds:.0f} | {LIMITS[step.name]} |" for step in steps]
    lines += ["", "## Environment", "", by["environment"].text, "",
              "## CUDA-marked tests (pytest -m cuda)", "", by["cuda-tests"].text or by["cuda-tests"].status, "",
              by["syncs"].text, "",
              "## Performance: R1, R3, R4 in fp32, TF32 and bf16-mixed", "",
              "Memory against experiences learned (1, 10, 50): the memory section of perf-fp32.md and perf-bf16.md.",
              "", by["perf"].text, "",
              f"## PACS, ViT-Ti ({args.architecture}, {args.image_size} px): 32-true against bf16-mixed", "",
              by["pacs"].text, "", "## Commands", "", "```bash"]
    lines += [shown(command, step.env) + ("  # from the repository's root" if step.cwd == ROOT else "")
              for step in steps for command in step.commands]
    lines += ["```", ""]
    return "\n".join(lines)

