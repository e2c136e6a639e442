"""Speed and memory of CoLoR's training and routed inference, as ratios measured side by side.

    python -m benchmarks.perf                      # ViT-B/16 shape, CPU (CUDA when present)
    python -m benchmarks.perf --device cuda --batch-size 64 --bf16 --out benchmarks/results/perf-cuda.md
    python -m benchmarks.perf --only memory        # only the memory-growth section, replaced in --out
    python -m benchmarks.perf --only kernels       # only the mixed-expert kernels section (benchmarks.perf.kernels)

Everything runs in this one process on the same inputs. Timings are
interleaved: after a warm-up round, each of ``--rounds`` rounds runs every
timed call once, in an order rotated by one place per round, and every ratio is
computed within a round from that round's timings. Figures are the median over
rounds with the min and max. Weights are random (timings do not depend on them).

The training and evaluation rows time the strategies users run (:mod:`benchmarks.perf.strategies`): each
strategy is built by its constructor on the same seeded ViT, trained by its own ``train`` on all but the last
of ``--experts`` experiences of a synthetic stream, then timed inside its own ``train`` of the last experience
(one iteration of its training loop per round, held between rounds in a thread of its own) and its own
``eval`` of one batch (one iteration of its evaluation loop, between those training iterations). The other
rows time the package's model and kernels directly. Printed and written as a markdown table:

* R1 = CoLoR training iteration / frozen-backbone forward (ideal about 2.0)
* R2 = CoLoR training iteration / full fine-tuning iteration (Avalanche's ``Naive``), and their training memory
* R3 = CoLoR evaluation throughput / plain ViT forward throughput (ideal 0.5)
* R4 = routed inference time with 10 experts mixed in each batch / with 1 expert (ideal 1.0)
* R5 = our expert pass / peft's mixed-adapter pass (``adapter_names``), 10 experts in a batch
* R5 overhead = (our expert pass - plain forward) / (peft's mixed-adapter pass - plain forward),
  for 1, 2, 10 and 50 experts in one batch (``--mixed-batch-size`` samples, 50 by default)
* routing (nearest prototype) and k-means fit time as a share of a forward
* the class-level routers (ridge, gaussian): routing and fitting time as a share of a forward
* SD-LoRA, InfLoRA, LoRA-Sub and CL-LoRA (``--experts`` - 1 experiences learned, the last one training): their
  training iteration / frozen-backbone forward, and their evaluation throughput / CoLoR's (one forward and no
  router against two passes; CL-LoRA's task-specific blocks run once per finished experience). Each is its
  strategy's own: its optimiser, loss and schedule (LoRA-Sub's projected Adam and triplet loss, CL-LoRA's
  teacher forward, two gradients and two SGD steps), its prediction (LoRA-Sub's nearest class mean)
* loader / step = images per second of a training data loader (JPEG photos decoded, RandomResizedCrop,
  flip, normalise, with ``--loader-workers`` worker processes) / images per second of the CoLoR
  training iteration: below 1 the accelerator waits for the data
* training memory against experiences learned (``--memory-experiences``, 1, 10 and 50 by default), on
  ``--memory-model`` (ViT-S/16 by default: 50 InfLoRA experiences take minutes on a CPU): for CoLoR, S-Prompts,
  L2P, SD-LoRA, InfLoRA, LoRA-Sub and CL-LoRA, the learned state plus one training step of experience t, and
  the state stored after it (:mod:`benchmarks.perf.memory`); a section of its own, which ``--only
  memory`` measures alone and replaces in ``--out``
"""

from __future__ import annotations

import argparse
import copy
import shlex
import sys
import time
import warnings
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import timm
import torch
from avalanche.core import SupervisedPlugin
from timm.data import resolve_data_config
from torch import nn

from avalanche_color import ExpertLearnedNothing, fit_prototypes
from avalanche_color.routing.routers import ClassRouter
from benchmarks.perf.kernels import kernel_section
from benchmarks.perf.memory import IterationMemory, memory_rows
from benchmarks.perf.strategies import (Clock, TrainingTurns, evaluation_variant, grown, strategies, synthetic_stream,
                                        timm_vit, training_variant)
from benchmarks.perf.timing import Spread, Variant, interleaved, machine, per_round, seconds
from benchmarks.perf.workloads import (CLASS_ROUTERS, CLASSES, PHOTO_SIZE, PHOTOS, ROUTER_WIDTH, JPEGDataset,
                                       build_color, fitted_class_routers, jpeg_photos, load_epoch,
                                       paper_train_transform, peft_adapters, training_loader)

RESULTS = Path(__file__).parents[1] / "results"
WARMUP_ROUNDS = 1
INFERENCE_ROWS = ("CoLoR", "SD-LoRA", "InfLoRA", "LoRA-Sub", "CL-LoRA")  # the methods whose evaluation is timed


def parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224", help="timm model name (random weights)")
    parser.add_argument("--batch-size", type=int, default=10, help="at least --experts: one sample per expert")
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--experts", type=int, default=10, help="experts mixed in a batch for R3, R4 and R5")
    parser.add_argument("--mixed-experts", default="1,2,10,50",
                        help="comma-separated numbers of experts in one batch for the R5 overhead rows ('' for none)")
    parser.add_argument("--mixed-batch-size", type=int, default=None,
                        help="batch of the R5 rows (default: the largest of --mixed-experts, at least --batch-size)")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds after one warm-up round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="run the models under torch.autocast(bfloat16)")
    parser.add_argument("--matmul-precision", choices=("highest", "high", "medium"), default="highest",
                        help="torch.set_float32_matmul_precision: highest (float32), high (TF32 on Ampere and newer GPUs)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--loader-workers", default="0,2",
                        help="comma-separated DataLoader worker counts for the loader rows ('' for none)")
    parser.add_argument("--loader-batches", type=int, default=8,
                        help="batches (of --batch-size) per timed loader epoch")
    parser.add_argument("--memory-experiences", default="1,10,50",
                        help="comma-separated numbers of experiences learned for the memory rows ('' for none)")
    parser.add_argument("--memory-model", default="vit_small_patch16_224",
                        help="timm model name of the memory rows (random weights)")
    parser.add_argument("--only", choices=("memory", "kernels"), default=None,
                        help="'memory': only the memory rows; 'kernels': only the two mixed-expert kernels side by "
                             "side (R3, R4, expert-pass overhead, operators per forward); their section replaced in "
                             "--out (the rest kept)")
    parser.add_argument("--out", type=Path, default=RESULTS / "perf.md")
    return parser, parser.parse_args()


def main() -> None:
    parser, args = parse_args()
    warnings.filterwarnings("ignore", message=".*adapter_names.*")
    warnings.filterwarnings("ignore", category=ExpertLearnedNothing)  # random images: nothing is learned
    warnings.filterwarnings("ignore", message="No loggers specified")  # the strategies' evaluators log nothing
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.set_float32_matmul_precision(args.matmul_precision)
    precision = (partial(torch.autocast, device.type, dtype=torch.bfloat16) if args.bf16 else nullcontext)
    memory_counts = [int(n) for n in args.memory_experiences.split(",") if n.strip()]
    if min(memory_counts, default=1) < 1 or (args.only == "memory" and not memory_counts):
        parser.error(f"--memory-experiences must be counts >= 1 (at least one with --only memory), "
                     f"got {args.memory_experiences!r}")
    if args.only is not None:  # one section; the other rows' options play no part
        text = (memory_rows(args, command_line(parser, args), memory_counts, device) if args.only == "memory"
                else kernel_section(args, command_line(parser, args), device, precision))
        print(text)
        old = args.out.read_text() if args.out.exists() else ""
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(replace_section(old, text) if old else text + "\n")
        return
    mixed_counts = [int(n) for n in args.mixed_experts.split(",") if n.strip()]
    loader_workers = [int(n) for n in args.loader_workers.split(",") if n.strip()]
    if min(loader_workers, default=0) < 0 or args.loader_batches < 1:
        parser.error(f"--loader-workers must be counts >= 0 and --loader-batches >= 1, got "
                     f"{args.loader_workers!r} and {args.loader_batches}")
    mixed_batch = args.mixed_batch_size or max([args.batch_size, *mixed_counts])
    if mixed_counts and max(mixed_counts) > mixed_batch:
        parser.error(f"--mixed-batch-size {mixed_batch} cannot hold {max(mixed_counts)} experts")
    if args.experts > args.batch_size:
        parser.error(f"--batch-size {args.batch_size} cannot hold {args.experts} experts")

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    make_vit = lambda: timm.create_model(args.model, pretrained=False, num_classes=0)  # noqa: E731
    plain = make_vit().to(device).eval()
    size = plain.patch_embed.img_size
    experts = max([args.experts, *mixed_counts])  # experts in the model
    model = build_color(make_vit(), experts, args.rank, CLASSES, args.k, device)

    def mix(batch: int, count: int) -> torch.Tensor:
        """``count`` experts spread evenly over ``batch`` samples, in random order."""
        return (torch.arange(batch) % count)[torch.randperm(batch, generator=generator)].to(device)

    x = torch.randn(args.batch_size, 3, *size, generator=generator).to(device)
    mixed, single = mix(args.batch_size, args.experts), torch.zeros(args.batch_size, dtype=torch.long, device=device)
    xm = torch.randn(mixed_batch, 3, *size, generator=generator).to(device)
    mixes = {count: mix(mixed_batch, count) for count in mixed_counts}

    # Inference variants: ``module`` (CoLoR's model by default) in eval mode, no gradients.
    def inference(fn, module: nn.Module = model):
        def run():
            with torch.no_grad():
                fn()
        return Variant(run, setup=module.eval)

    def routed_inference(experts: torch.Tensor) -> torch.Tensor:
        """model(x) with the routing pass as usual but a chosen mix of experts."""
        model.router(model.routing_features(x))
        return model.predict(x, experts)

    with torch.no_grad(), precision():
        routing_input = model.eval().routing_features(x)
    kmeans_features = torch.nn.functional.normalize(torch.randn(1000, model.num_features, generator=generator), dim=-1)
    class_routers = {kind: router.to(device) for kind, router in
                     fitted_class_routers(model.num_features, args.experts, generator).items()}
    variants = {
        "plain forward": inference(lambda: plain(x)),
        "frozen-backbone forward": inference(lambda: model.features(x)),
        f"routed inference, {args.experts} experts mixed": inference(lambda: routed_inference(mixed)),
        "routed inference, 1 expert": inference(lambda: routed_inference(single)),
        f"expert pass, {args.experts} experts mixed": inference(lambda: model.predict(x, mixed)),
        "expert pass, 1 expert": inference(lambda: model.predict(x, single)),
        "routing (nearest prototype)": inference(lambda: model.router(routing_input)),
        "k-means fit (1000 samples)": Variant(lambda: fit_prototypes(kmeans_features, args.k, seed=0, n_init=10),
                                              autocast=False),
        **{f"routing ({kind} router)": inference(lambda router=router: router(routing_input))
           for kind, router in class_routers.items()},
        **{f"{kind} router fit (1000 samples)": Variant(
            lambda kind=kind: ClassRouter(kind, model.num_features, ROUTER_WIDTH).fit(
                0, kmeans_features, torch.arange(1000) % CLASSES), autocast=False)
           for kind in class_routers},
    }

    # Training and evaluation through the strategies: each built by its constructor on the same seeded ViT and
    # grown by its own train calls on every experience of a synthetic stream but the last; on the last, one
    # iteration of its own training loop per round (TrainingTurns), and its own eval of one batch of that
    # experience's test images. The last experience: one untimed iteration, one per round (warm-up included),
    # one for the memory row.
    batches = 1 + WARMUP_ROUNDS + args.rounds + 1
    stream = synthetic_stream(args.experts, CLASSES, tuple(size), [max(args.batch_size, args.k)] * (args.experts - 1)
                              + [batches * args.batch_size], args.batch_size)
    clocks: dict[str, Clock] = {}
    probes: dict[str, IterationMemory] = {}
    turns: dict[str, TrainingTurns] = {}

    def plugins(name: str) -> list[SupervisedPlugin]:
        clocks[name], probes[name] = Clock(device), IterationMemory(device)
        return [probes[name], clocks[name]]

    makers = strategies(timm_vit(args.model), args.rank, args.k, args.batch_size, device,
                        "bf16-mixed" if args.bf16 else "32-true", CLASSES * args.experts, plugins)
    for name, make in makers.items():
        start = time.perf_counter()
        strategy = make()
        own_precision = name != "full fine-tuning"  # Avalanche's Naive has no precision option: autocast around it
        if own_precision:
            grown(strategy, stream)
        turns[name] = TrainingTurns(strategy, stream.train_stream[args.experts - 1], clocks[name],
                                    nullcontext if own_precision else precision).start()
        variants[f"{name} training iteration"] = training_variant(turns[name])
        if name in INFERENCE_ROWS:
            variants[f"{name} evaluation iteration"] = evaluation_variant(strategy, stream.test_stream[args.experts - 1],
                                                                          clocks[name])
        print(f"[perf] {name}: built and grown in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    # The data a training step needs: one epoch of a loader per timing, its workers kept between epochs.
    data = resolve_data_config({}, model=plain)
    photos = JPEGDataset(jpeg_photos(PHOTOS), args.loader_batches * args.batch_size,
                         paper_train_transform(size[0], data["mean"], data["std"]), CLASSES)
    loaders = {workers: training_loader(photos, args.batch_size, workers, device) for workers in loader_workers}
    for workers, loader in loaders.items():
        variants[f"loader epoch, {workers} {plural(workers, 'worker')}"] = Variant(
            partial(load_epoch, loader, device), autocast=False)

    # Mixed batches of the R5 rows: ours and peft's, against the plain forward of the same batch.
    peft_note = ""
    if mixed_counts:
        variants[f"plain forward, batch {mixed_batch}"] = inference(lambda: plain(xm))
        for count, experts_of in mixes.items():
            variants[f"expert pass, {count} {plural(count)} in batch {mixed_batch}"] = inference(
                partial(model.predict, xm, experts_of))
        try:
            peft_model = peft_adapters(copy.deepcopy(plain), max(mixed_counts), args.rank)
        except ImportError:
            peft_note = ("peft is not installed (pip install -c constraints.txt -e '.[perf]'): "
                         "R5 and R5 overhead not measured.")
        else:
            for count, experts_of in mixes.items():
                names = [f"expert{int(e)}" for e in experts_of]
                name = f"peft mixed-adapter pass, {count} {plural(count, 'adapter')} in batch {mixed_batch}"
                variants[name] = inference(partial(peft_model, xm, adapter_names=names))

    rounds = interleaved(variants, args.rounds, device, precision, warmup_rounds=WARMUP_ROUNDS)
    memory = {}
    for name in ("CoLoR", "full fine-tuning"):  # one more iteration each, its memory measured
        probes[name].measure_next()
        turns[name].step()
        memory[name] = probes[name].step.total
    for training in turns.values():
        training.close()

    # Ratios, each computed within a round.
    e, m = args.experts, mixed_batch
    rows = ratio_rows(rounds, args, memory, e, m, mixed_counts, peft_note, loader_workers, photos, size)

    rounds_label = f"median (min-max) of {args.rounds} {plural(args.rounds, 'round')}"
    lines = [f"`{command_line(parser, args)}`", "",
             f"{args.model} (random weights), batch {args.batch_size} (R5 rows: batch {m}), rank {args.rank}, "
             f"k {args.k}; device {device.type} ({machine(device)}); "
             f"{'bf16 autocast' if args.bf16 else 'float32'}, float32 matmul precision {args.matmul_precision}; "
             f"torch {torch.__version__}", "",
             f"Timings interleaved: a warm-up round, then {args.rounds} {plural(args.rounds, 'round')}, each running every timed call once "
             "in an order rotated by one place per round; each ratio is computed within a round from that round's "
             "timings and reported as the median over rounds (min-max).", "",
             f"Training and evaluation rows: each strategy (CoLoR, SD-LoRA, InfLoRA, LoRA-Sub, CL-LoRA at rank "
             f"{args.rank}, their other options their defaults, one epoch per experience; full fine-tuning: "
             f"Avalanche's Naive, SGD with momentum) built on the same seeded ViT, trained by its own `train` on "
             f"{args.experts - 1} experiences of a synthetic stream ({CLASSES} classes each, random images), then "
             f"timed inside its own `train` of experience {args.experts} (one iteration of its training loop per "
             "round: forward, loss, backward, optimiser step, schedule and plugins' iteration callbacks) and its "
             "own `eval` of one batch (one iteration of its evaluation loop), which runs between those iterations "
             f"(what Avalanche's periodic evaluation sees: {args.experts - 1} experiences finished). "
             f"Model-level rows (R4, the expert passes, R5, routing): a CoLoR model of {experts} experts "
             "with random prototypes and non-zero B.", "",
             f"| ratio | what | {rounds_label} | ideal | target |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {what} | {value.format()} | {ideal} | {target} |" for name, what, value, ideal, target in rows]
    lines += ["", f"| timing | seconds, {rounds_label} |", "|---|---|"]
    lines += [f"| {name} | {seconds(rounds, name).format(4)} |" for name in variants]
    lines += ["", "| training memory beyond weights | MiB |", "|---|---|"]
    lines += [f"| {name} | {size / 2**20:.1f} |" for name, size in memory.items()]
    memory_kind = ("CUDA allocator peak during a step" if device.type == "cuda"
                   else "CPU: tensors autograd saves for backward + gradients + optimiser state")
    lines += ["", f"Memory measured as: {memory_kind}."]
    if peft_note:
        lines += ["", peft_note]
    elif mixed_counts:
        lines += ["", "peft: LoRA on every fused qkv (`target_modules=[\"qkv\"]`), so it adapts q, k and v "
                  "(it cannot leave k out of a fused layer); our experts adapt q and v only, as the paper does. "
                  "One expert in a batch: ours folds it into the qkv weight, peft still runs its mixed-batch path."]
    if memory_counts:
        lines += ["", memory_rows(args, command_line(parser, args), memory_counts, device)]
    report = "\n".join(lines)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n")


def ratio_rows(rounds: list[dict[str, float]], args: argparse.Namespace, memory: dict[str, int], e: int, m: int,
               mixed_counts: list[int], peft_note: str, loader_workers: list[int], photos: JPEGDataset,
               size: tuple[int, ...]) -> list[tuple]:
    """The rows (name, what, value, ideal, target), ``e`` experts mixed, batch ``m`` in the R5 rows."""
    routed_mixed, expert_mixed = f"routed inference, {e} experts mixed", f"expert pass, {e} experts mixed"
    color_train, color_eval = "CoLoR training iteration", "CoLoR evaluation iteration"
    ratio = partial(per_round, rounds)
    rows = [
        ("R1", "CoLoR training iteration / frozen-backbone forward",
         ratio(lambda t: t[color_train] / t["frozen-backbone forward"]), "about 2.0", "<= 2.3"),
        ("R2", "CoLoR training iteration / full fine-tuning iteration (Avalanche's Naive)",
         ratio(lambda t: t[color_train] / t["full fine-tuning training iteration"]), "", ""),
        ("R2 memory", "CoLoR / full fine-tuning training memory (one iteration each)",
         Spread([memory["CoLoR"] / memory["full fine-tuning"]]), "", "<= 0.6"),
        ("R3", f"CoLoR evaluation throughput / plain forward throughput ({e - 1} experts, the router's choice)",
         ratio(lambda t: t["plain forward"] / t[color_eval]), "0.5", ">= 0.45"),
        ("R4", f"routed inference, {e} experts mixed / 1 expert (time; the model's predict)",
         ratio(lambda t: t[routed_mixed] / t["routed inference, 1 expert"]), "1.0", "<= 1.15"),
        ("R4 expert pass", f"expert pass, {e} experts mixed / 1 expert (time)",
         ratio(lambda t: t[expert_mixed] / t["expert pass, 1 expert"]), "1.0", ""),
    ]
    # One forward and no router against CoLoR's two passes, LoRA-Sub's nearest mean included; CL-LoRA runs its
    # shared blocks (half the blocks) once and its task-specific ones once per finished experience (e - 1: the
    # evaluations run while experience e trains).
    cl_lora_passes = (1 + (e - 1)) / 2
    inference_ideal = {"SD-LoRA": "about 2", "InfLoRA": "about 2", "LoRA-Sub": "about 2",
                       "CL-LoRA": f"about {2 / cl_lora_passes:.2f}"}
    for name, ideal in inference_ideal.items():
        rows += [
            (f"{name} step", f"{name} training iteration / frozen-backbone forward ({e - 1} experiences learned, "
             f"experience {e} training)",
             ratio(lambda t, name=name: t[f"{name} training iteration"] / t["frozen-backbone forward"]), "", ""),
            (f"{name} inference", f"{name} evaluation throughput / CoLoR evaluation throughput",
             ratio(lambda t, name=name: t[color_eval] / t[f"{name} evaluation iteration"]), ideal, ""),
        ]
    if mixed_counts and not peft_note:
        ours = lambda n: f"expert pass, {n} {plural(n)} in batch {m}"  # noqa: E731
        peft = lambda n: f"peft mixed-adapter pass, {n} {plural(n, 'adapter')} in batch {m}"  # noqa: E731
        plain_m = f"plain forward, batch {m}"
        if e in mixed_counts:
            rows.append(("R5", f"our expert pass / peft mixed-adapter pass, {e} experts in batch {m} (time)",
                         ratio(lambda t: t[ours(e)] / t[peft(e)]), "", ""))
        for n in mixed_counts:
            rows.append((f"R5 overhead, {n} {plural(n)}",
                         f"(our expert pass - plain forward) / (peft's - plain forward), {n} in batch {m}",
                         ratio(lambda t, n=n: (t[ours(n)] - t[plain_m]) / (t[peft(n)] - t[plain_m])), "", "<= 1.0"))
    rows += [
        ("routing", "nearest prototype / plain forward (time)",
         ratio(lambda t: t["routing (nearest prototype)"] / t["plain forward"]), "", "< 0.01"),
        ("k-means", "k-means fit on 1000 samples / forward of 1000 samples",
         ratio(lambda t: t["k-means fit (1000 samples)"] / (t["plain forward"] * 1000 / args.batch_size)), "", "< 0.01"),
    ]
    for kind in CLASS_ROUTERS:
        rows += [
            (f"{kind} router", f"{kind} router ({args.experts} experts x {CLASSES} classes) / plain forward (time)",
             ratio(lambda t, kind=kind: t[f"routing ({kind} router)"] / t["plain forward"]), "", "< 0.02"),
            (f"{kind} router fit", f"{kind} router fit on 1000 samples / forward of 1000 samples",
             ratio(lambda t, kind=kind: t[f"{kind} router fit (1000 samples)"] / (t["plain forward"] * 1000 / args.batch_size)),
             "", "< 0.02"),
        ]

    step_rate = lambda t: args.batch_size / t["CoLoR training iteration"]  # noqa: E731
    for workers in loader_workers:
        loader_rate = lambda t, w=workers: len(photos) / t[f"loader epoch, {w} {plural(w, 'worker')}"]  # noqa: E731
        rows += [
            (f"loader, {workers} {plural(workers, 'worker')}",
             f"loader images/s: {PHOTOS} JPEG photos {PHOTO_SIZE[0]}x{PHOTO_SIZE[1]} decoded, RandomResizedCrop("
             f"{size[0]}), flip, normalise, batch {args.batch_size}", ratio(loader_rate), "", ""),
            (f"loader / step, {workers} {plural(workers, 'worker')}",
             "loader images/s / CoLoR training iteration images/s", ratio(lambda t, r=loader_rate: r(t) / step_rate(t)),
             "", ">= 1"),
        ]
    if loader_workers:
        rows.append(("training step", f"CoLoR training iteration images/s, batch {args.batch_size}",
                     ratio(step_rate), "", ""))
    return rows


def command_line(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``python -m benchmarks.perf`` with every option that differs from its default."""
    options = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {shlex.quote(str(v))}")
                       for k, v in vars(args).items() if k != "out" and v != parser.get_default(k))
    return f"python -m benchmarks.perf {options}".strip()


def replace_section(text: str, section: str) -> str:
    """``text`` with the section whose heading is ``section``'s first line replaced by ``section`` (up to
    the next heading of that level, or the end), or with ``section`` appended when it has none."""
    heading = section.splitlines()[0]
    level = heading.split(" ")[0] + " "
    lines = text.splitlines()
    if heading not in lines:
        return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(level)), len(lines))
    rest = lines[end:]
    return "\n".join(lines[:start] + section.rstrip("\n").splitlines() + ([""] + rest if rest else [])) + "\n"


def plural(count: int, word: str = "expert") -> str:
    return word if count == 1 else word + "s"


if __name__ == "__main__":
    main()
