"""Our CL-LoRA (:class:`avalanche_color.CLLoRA`) side by side with its authors' code on the same weights and
batches, in float64 on the CPU, and a table of the largest absolute differences.

    python -m benchmarks.investigations.side_by_side.cl_lora --authors-code /tmp/cllora_code

``--authors-code`` is an extracted copy of JiangpengHe/CL-LoRA at df4e74e (``git -C <mirror> archive HEAD |
tar -x -C /tmp/cllora_code``); its modules are imported from there (``models/cllora.py`` ``Learner``,
``backbone/vit_cllora.py``, ``utils/inc_net.py`` ``OurNet``), nothing of it is copied here.

How their code is driven. Their ``Learner`` is built from ``exps/cifar.json`` with only the stream's sizes,
the epochs and the device changed, and ``utils.inc_net.get_backbone`` replaced by a call of their own
``vit_base_patch16_224_in21k_cllora`` in which ``timm.create_model`` returns our seeded timm ViT and their
``VisionTransformer`` gets small depth, heads, MLP ratio and image size (their loader then splits its qkv,
renames the MLP and sets what trains, as in their runs). The width stays 768: their
``CosineLinearFeature.forward_diagonal`` and their qkv split hard-code it. Per experience the script runs
``Learner.incremental_train``'s body without the data manager: ``OurNet.update_fc``, ``Learner._train`` (their
optimiser, schedule and ``_init_train`` loop) on the batches our strategy trained on, ``OurNet.add_fc``,
``Learner.replace_fc``, their evaluation forward, ``Learner.after_task``. The weights that each side draws for
a new experience (adapters, block weights, proxy head) are ours, copied into theirs before it trains.
Three things are shimmed while their code runs: ``torch.Tensor.cuda`` is the identity
(``Attention_lora.forward`` calls ``torch.ones(3).cuda()`` for the shared blocks' coefficients), the
default dtype is float64 (so their new modules are float64), and ``timm.models.layers.weight_init`` is
aliased to ``timm.layers.weight_init`` (``backbone/linears.py`` imports the timm 0.6 path).

Their per-batch sequence from the second experience on (``_init_train``: the KD backward, its reweighting,
``optimizer.step()``, then ``loss.backward()`` of the graph built before that step, ``optimizer.step()``)
runs under three optimisers, all torch's SGD with their parameters and options:

* ``torch``: stock SGD; the second backward raises on current torch (reported with the line).
* ``deferred``: the first ``step()`` of a batch only keeps the reweighted KD gradients; the second applies
  them, then the cross-entropy ones: both gradients at the batch's parameters, our reading.
* ``no-version-bump``: SGD's update written through ``param.data``, which leaves the parameters' autograd
  version counters alone, as torch 2.0.1's CUDA ``foreach`` SGD did: their literal sequence then runs and
  the second backward reads the tensors it saved (the shared U's, the proxy weight and sigma) after step 1.

Stream: ``--stream domain`` (the default; the same classes in every experience, their code seeing class c
of experience e as class ``e * classes + c``, so a prediction is the class of the best (experience, class)
pair) or ``--stream class``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import torch
from avalanche.benchmarks import tensors_benchmark
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from benchmarks.investigations.side_by_side.cl_lora.authors_code import WIDTH, import_authors
from benchmarks.investigations.side_by_side.cl_lora.our_run import Named, Recorder, run_ours
from benchmarks.investigations.side_by_side.cl_lora.their_run import MODES, run_theirs

AUTHORS_COMMIT = "df4e74efe589ca1aa872d3843315ab6851192cf3"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", type=Path, required=True,
                        help=f"extracted copy of JiangpengHe/CL-LoRA (commit {AUTHORS_COMMIT[:7]})")
    parser.add_argument("--stream", choices=("domain", "class"), default="domain")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--mlp-ratio", type=float, default=1.0)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=8)
    parser.add_argument("--experiences", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    sizes = SimpleNamespace(**vars(options), image=16)
    authors = import_authors(options.authors_code.resolve())

    torch.manual_seed(options.seed)
    vit = VisionTransformer(img_size=sizes.image, patch_size=4, embed_dim=WIDTH, depth=options.depth,
                            num_heads=options.heads, mlp_ratio=options.mlp_ratio, num_classes=0).double().eval()
    benchmark, test = make_stream(sizes)
    ours = run_ours(vit, benchmark, test, sizes)
    print(f"CL-LoRA, ours against JiangpengHe/CL-LoRA@{AUTHORS_COMMIT[:7]}: float64, CPU, {sizes.stream} stream, "
          f"{sizes.experiences} experiences x {sizes.classes} classes x {sizes.per_class} images, ViT width {WIDTH} "
          f"depth {sizes.depth} ({sizes.depth // 2} shared), rank {sizes.rank}, batch {sizes.batch}, "
          f"{sizes.epochs} epochs, lr {sizes.lr}, weight decay {sizes.weight_decay}; max |ours - theirs|")
    recorder = ours["recorder"]
    for e in range(1, sizes.experiences):
        ratios = ", ".join(f"{kd:.2e}/{ce:.2e}" for kd, ce in recorder.shared_gradients[e])
        drift = max(float((ours["end"][e][k] - ours["end"][e - 1][k]).norm() / ours["end"][e - 1][k].norm())
                    for k in ours["end"][e] if k.startswith("shared.") and k.endswith(".up"))
        print(f"ours, experience {e}: |gradient of the shared U's| per batch, KD (reweighted) / CE: {ratios}; "
              f"largest relative change of a shared U over the experience: {drift:.3f}")
    for mode in options.modes:
        theirs = run_theirs(authors, vit, ours, test, sizes, mode)
        print("\n".join(report(ours, theirs, sizes, mode)), flush=True)


def make_stream(sizes: SimpleNamespace) -> tuple[Any, list[tuple[Tensor, Tensor]]]:
    """Train and test tensors per experience; ``domain``: the same classes shifted per experience."""
    g = torch.Generator().manual_seed(sizes.seed)
    templates = 2 * torch.randn(sizes.classes * (1 if sizes.stream == "domain" else sizes.experiences), 3,
                                sizes.image, sizes.image, generator=g)
    train, test = [], []
    for e in range(sizes.experiences):
        offset = 1.5 * torch.randn(3, 1, 1, generator=g) if sizes.stream == "domain" else 0
        first = 0 if sizes.stream == "domain" else e * sizes.classes
        labels = torch.arange(first, first + sizes.classes).repeat_interleave(sizes.per_class)
        for store in (train, test):
            images = templates[labels] + 0.5 * torch.randn(len(labels), 3, sizes.image, sizes.image, generator=g)
            store.append((images + offset, labels))
    return tensors_benchmark(train, test, task_labels=[0] * sizes.experiences), test


def their_predictions(logits: Tensor, sizes: SimpleNamespace) -> Tensor:
    """Their prediction as a class of ours: the class of the best (experience, class) column."""
    predicted = logits.argmax(1)
    return predicted % sizes.classes if sizes.stream == "domain" else predicted


def their_class_scores(logits: Tensor, sizes: SimpleNamespace) -> Tensor:
    """Their logits as ours: on a domain stream a class's best score over its experiences."""
    if sizes.stream != "domain":
        return logits
    return logits.reshape(logits.shape[0], -1, sizes.classes).amax(1)


def max_abs(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def group_of(name: str) -> str:
    parts = name.split(".")
    if parts[0] in ("shared", "teacher"):
        return f"{parts[0]} {parts[-1]}"
    if parts[0] == "specific":
        return f"specific {parts[1]} {parts[-1]}"
    return " ".join(parts[:-1] + [parts[-1]]) if parts[0] == "proxy" else name


def grouped(ours: Named, theirs: Named) -> dict[str, tuple[float, float]]:
    """Per group of names: (max |ours - theirs|, max |ours|)."""
    out: dict[str, tuple[float, float]] = {}
    for k in ours:
        if k not in theirs:
            continue
        g = group_of(k)
        d, s = out.get(g, (0.0, 0.0))
        out[g] = (max(d, max_abs(ours[k], theirs[k])), max(s, float(ours[k].abs().max())))
    return out


def row(label: str, difference: float, scale: Optional[float] = None) -> str:
    tail = "" if scale is None else f"   (max |value| {scale:.3g})"
    return f"  {label:<52} {difference:10.2e}{tail}"


def report(ours: dict[str, Any], theirs: dict[str, Any], sizes: SimpleNamespace, mode: str) -> list[str]:
    lines = [f"== their optimiser: {mode}"]
    recorder: Recorder = ours["recorder"]
    for e in range(sizes.experiences):
        if e not in theirs["first"]:
            break
        mine, other = recorder.first[e], theirs["first"][e]
        lines.append(f" experience {e}, first batch, at its starting parameters")
        for name, f in mine["features"].items():
            lines.append(row(f"(a) feature: {name}", max_abs(f, other["features"][name]), float(f.abs().max())))
        lines.append(row("(b) proxy logits", max_abs(mine["logits"], other["logits"]), float(mine["logits"].abs().max())))
        for term in ("ce", "kd", "ortho"):
            if mine[term] is not None:
                lines.append(row(f"(b) loss {term} = {mine[term]:.6g}", abs(mine[term] - other[term])))
        steps = other.get("step_grads") or {}
        for s, key in ((0, "step1"), (1, "step2")):
            if not mine[key] or s >= len(steps):
                continue
            label = ("step 1: KD, reweighted" if e and s == 0 else "step 2: CE + 1e-4 ortho" if e else "CE")
            for g, (d, scale) in grouped(mine[key], steps[s]).items():
                lines.append(row(f"(b) gradient, {label}: {g}", d, scale))
    if theirs["error"]:
        e, where, message = theirs["error"]
        lines.append(f" experience {e}: their code raised at {where}: RuntimeError: {message}")
        return lines
    for e in range(sizes.experiences):
        mine_steps, their_steps = recorder.steps[e], theirs["steps"][e]
        worst = max(max(d for d, _ in grouped(a, b).values()) for a, b in zip(mine_steps, their_steps))
        lines.append(f" experience {e}: {len(their_steps)} batches")
        lines.append(row(f"(c) parameters, worst over its batches", worst))
        for g, (d, scale) in grouped(ours["end"][e], theirs["end"][e]).items():
            lines.append(row(f"(c) parameters at its end: {g}", d, scale))
        lines.append(row("(c) prototypes", max_abs(ours["prototypes"][e], theirs["prototypes"][e]),
                         float(ours["prototypes"][e].abs().max())))
        mine_eval, their_eval = ours["eval"][e], theirs["eval"][e]
        scores = their_class_scores(their_eval, sizes)
        agree = int((mine_eval.argmax(1) == their_predictions(their_eval, sizes)).sum())
        lines.append(row("(d) evaluation scores", max_abs(mine_eval, scores)))
        lines.append(f"  (d) predictions agree on {agree}/{len(mine_eval)} test images")
    return lines


if __name__ == "__main__":
    main()
