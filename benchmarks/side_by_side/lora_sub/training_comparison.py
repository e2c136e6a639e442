"""(a)-(e) over the two experiences' training: the rows comparing what each side did, step by step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from avalanche_color.peers.lora_sub.strategy import augmented_triplet_loss
from benchmarks.side_by_side.lora_sub.our_run import Recorder
from benchmarks.side_by_side.lora_sub.table import max_abs, row, scale_of
from benchmarks.side_by_side.lora_sub.weights import our_component, their_component


def compare_training(ours: dict[str, Any], theirs: dict[str, Any], sizes: SimpleNamespace, rows: list[str]) -> None:
    recorder: Recorder = ours["recorder"]
    for t in range(sizes.experiences):
        if t:
            our_cov, their_cov = recorder.covariances[t], theirs["covariances"][t - 1]
            rows.append(row(f"(b) exp {t}: covariance per block (training pass)", max_abs(our_cov, their_cov),
                            scale_of(our_cov)))
            our_P = list(recorder.start[t]["projections"])
            rows.append(row(f"(b) exp {t}: P per block (k ours {ours['ranks'][t - 1]})",
                            max_abs(our_P, theirs["projections"][t - 1]), scale_of(our_P)))
        our_steps, their_steps = recorder.steps[t], theirs["steps"][t]
        if len(our_steps) != len(their_steps):
            rows.append(f"exp {t}: {len(our_steps)} steps ours, {len(their_steps)} theirs")
            continue
        rows.append(row(f"(c) exp {t}: learning rates, {len(our_steps)} steps",
                        max_abs([s["lrs"] for s in our_steps], [s["lrs"] for s in their_steps]), sizes.head_lr))
        start = our_component(recorder.start[t], t, sizes.depth)
        for n in (0, 1, len(our_steps) - 1):
            ours_p, theirs_p = our_steps[n]["component"], their_steps[n]["component"]
            rows.append(row(f"(c) exp {t}: A and B after step {n + 1} (moved {max_abs(ours_p, start):.1e})",
                            max_abs(ours_p, theirs_p), scale_of(ours_p)))
        rows_of = slice(t * sizes.classes, (t + 1) * sizes.classes)
        ours_h = [our_steps[-1]["head"][0][rows_of], our_steps[-1]["head"][1][rows_of]]
        rows.append(row(f"(c) exp {t}: head rows after step {len(our_steps)}",
                        max_abs(ours_h, their_steps[-1]["head"]), scale_of(ours_h)))
        features = [s["features"] for s in our_steps]
        rows.append(row(f"(a) exp {t}: normalised training features, every step",
                        max_abs(features, [f for f, _ in theirs["triplet"][t]]), 1.0))
        our_triplet = [augmented_triplet_loss(s["features"], y, s["prototypes"], s["prototype_classes"], sizes.margin)
                       for s, (_, y) in zip(our_steps, [b for epoch in recorder.batches[t] for b in epoch])]
        their_triplet = [v for _, v in theirs["triplet"][t]]
        rows.append(row(f"(d) exp {t}: triplet loss, every step", max_abs(our_triplet, their_triplet),
                        scale_of(our_triplet)))
        end = recorder.end[t]
        if t:
            ours_0 = our_component(end, 0, sizes.depth)
            rows.append(f"(c) exp {t}: component 0 moved during it (ours): "
                        f"{max_abs(ours_0, our_component(recorder.start[t], 0, sizes.depth)):.1e}")
            rows.append(row(f"(c) exp {t}: component 0 at its end", max_abs(ours_0, their_component(theirs["net"], 0)),
                            scale_of(ours_0)))
        ours_protos = end["prototypes"]
        rows.append(row(f"(e) exp {t}: prototypes", max_abs(ours_protos, theirs["prototypes"][t]),
                        scale_of(ours_protos)))
        rows.append(row(f"(e) exp {t}: test features", max_abs(ours["features"][t], theirs["features"][t]),
                        scale_of(ours["features"][t])))
        same = int((ours["predictions"][t] == theirs["predictions"][t]).sum())
        rows.append(f"(e) exp {t}: nearest-mean predictions equal: {same}/{len(ours['predictions'][t])}")
