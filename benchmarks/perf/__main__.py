"""``python -m benchmarks.perf``: speed and memory ratios measured side by side (the options and what each row
means: :mod:`benchmarks.perf.cli`)."""

from __future__ import annotations

import copy
import warnings
from contextlib import nullcontext
from functools import partial

import timm
import torch
from timm.data import resolve_data_config
from torch import nn

from avalanche_color import InfLoRAConfig, InfLoRAViT, SDLoRAConfig, SDLoRAViT, fit_prototypes
from avalanche_color.routing.routers import ClassRouter
from benchmarks.perf.cli import parse_args
from benchmarks.perf.kernels import kernel_section
from benchmarks.perf.learner import grown
from benchmarks.perf.learners_cvpr2025 import peer_learners
from benchmarks.perf.memory import training_memory
from benchmarks.perf.memory_section import memory_rows
from benchmarks.perf.ratios import ratio_rows
from benchmarks.perf.report import command_line, machine, plural, replace_section
from benchmarks.perf.sizes import CLASSES, PHOTOS, ROUTER_WIDTH
from benchmarks.perf.step import color_training_step
from benchmarks.perf.timing import Variant, interleaved, seconds
from benchmarks.perf.workloads import (JPEGDataset, build_color, build_lora_sum, fitted_class_routers, jpeg_photos,
                                       load_epoch, paper_train_transform, peft_adapters, training_loader)


def main() -> None:
    parser, args = parse_args()
    warnings.filterwarnings("ignore", message=".*adapter_names.*")
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
        text = (memory_rows(parser, args, memory_counts, device, precision) if args.only == "memory"
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
    labels = torch.randint(0, CLASSES, (args.batch_size,), generator=generator).to(device) + CLASSES * (experts - 1)
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

    # Training: CoLoR step (newest expert) against full fine-tuning of the same ViT.
    color_step, color_optimizer = color_training_step(model, x, labels)
    criterion = nn.CrossEntropyLoss()

    full = timm.create_model(args.model, pretrained=False, num_classes=CLASSES * experts).to(device).train()
    full_optimizer = torch.optim.SGD(full.parameters(), lr=1e-3, momentum=0.9)

    def full_step():
        full_optimizer.zero_grad(set_to_none=True)
        criterion(full(x), labels).backward()
        full_optimizer.step()

    variants["CoLoR training step"] = Variant(color_step, setup=model.train)
    variants["full fine-tuning step"] = Variant(full_step)

    # The LoRA peers that route nothing: one forward with every component summed in, one head.
    peer_labels = labels % CLASSES + CLASSES * (args.experts - 1)  # the classes of the experience being learned
    for name, model_class, config in (("SD-LoRA", SDLoRAViT, SDLoRAConfig(rank=args.rank)),
                                      ("InfLoRA", InfLoRAViT, InfLoRAConfig(rank=args.rank))):
        peer = build_lora_sum(model_class, config, make_vit(), args.experts, CLASSES, device)
        peer_optimizer = torch.optim.SGD(list(peer.trainable_parameters()), lr=1e-3, momentum=0.9)

        def peer_step(peer=peer, peer_optimizer=peer_optimizer):
            peer_optimizer.zero_grad(set_to_none=True)
            criterion(peer(x), peer_labels).backward()
            peer_optimizer.step()

        variants[f"{name} training step"] = Variant(peer_step, setup=peer.train)
        variants[f"{name} inference"] = inference(partial(peer, x), peer)
    # LoRA-Sub and CL-LoRA grown by their learners, each step its strategy's (optimiser, loss, CL-LoRA's two
    # gradients); inference on a copy with the last experience finished too (its prototypes, CL-LoRA's pass).
    for name, make_learner in peer_learners(make_vit, args.rank, CLASSES, device).items():
        learner = grown(make_learner(), args.experts)
        learned = copy.deepcopy(learner)
        learned.finish(args.experts - 1)
        learner_optimizer = learner.optimizer()
        variants[f"{name} training step"] = Variant(
            partial(learner.step, learner_optimizer, x, peer_labels), setup=learner.model.train)
        variants[f"{name} inference"] = inference(partial(learned.model, x), learned.model)

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

    rounds = interleaved(variants, args.rounds, device, precision)
    with precision():
        model.train()
        memory = {"CoLoR": training_memory(color_step, model, color_optimizer, device),
                  "full fine-tuning": training_memory(full_step, full, full_optimizer, device)}

    # Ratios, each computed within a round.
    e, m = args.experts, mixed_batch
    rows = ratio_rows(rounds, args, memory, e, m, mixed_counts, peft_note, loader_workers, photos, size)

    rounds_label = f"median (min-max) of {args.rounds} {plural(args.rounds, 'round')}"
    lines = [f"`{command_line(parser, args)}`", "",
             f"{args.model} (random weights), batch {args.batch_size} (R5 rows: batch {m}), rank {args.rank}, "
             f"{experts} experts in the model, k {args.k}; device {device.type} ({machine(device)}); "
             f"{'bf16 autocast' if args.bf16 else 'float32'}, float32 matmul precision {args.matmul_precision}; "
             f"torch {torch.__version__}", "",
             f"Timings interleaved: a warm-up round, then {args.rounds} {plural(args.rounds, 'round')}, each running every timed call once "
             "in an order rotated by one place per round; each ratio is computed within a round from that round's "
             "timings and reported as the median over rounds (min-max).", "",
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
        lines += ["", memory_rows(parser, args, memory_counts, device, precision)]
    report = "\n".join(lines)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
