"""The table of differences, per optimiser: max |ours - theirs| of the features, loss terms and gradients on each
experience's first batch, of the parameters, prototypes and evaluation scores."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from torch import Tensor

from benchmarks.side_by_side.cl_lora.our_run import Named, Recorder
from benchmarks.side_by_side.cl_lora.stream import their_class_scores, their_predictions


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
