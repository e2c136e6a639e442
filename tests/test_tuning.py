"""One tuning rule for every method: a validation split carved from the training experiences, and each
method's lr chosen on it from one grid (tiny ViTs, digits streams, CPU, seconds)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from avalanche_color.benchmarks.stream_building import validation_benchmark
from avalanche_color.runner import RunConfig, run_comparison
from avalanche_color.runner.config import RunConfigError
from streams import class_stream

pytestmark = pytest.mark.usefixtures("one_thread")


def images_and_labels(dataset) -> tuple[torch.Tensor, list[int]]:
    samples = [dataset[i] for i in range(len(dataset))]
    return torch.stack([s[0] for s in samples]), [int(s[1]) for s in samples]


def test_the_validation_split_holds_out_part_of_every_class_and_nothing_twice():
    benchmark = class_stream(num_experiences=2, per_class=10)
    split = validation_benchmark(benchmark, held_out=0.2, seed=0)
    assert len(split.train_stream) == len(split.test_stream) == 2
    for original, kept, held in zip(benchmark.train_stream, split.train_stream, split.test_stream):
        every, every_labels = images_and_labels(original.dataset)
        train, train_labels = images_and_labels(kept.dataset)
        validation, validation_labels = images_and_labels(held.dataset)
        assert len(train) + len(validation) == len(every)
        # each image once, in one part or the other: the two parts are the original, rearranged
        together = torch.cat([train, validation]).flatten(1)
        assert torch.equal(together[np.lexsort(together.T.numpy()[::-1])],
                           every.flatten(1)[np.lexsort(every.flatten(1).T.numpy()[::-1])])
        for label in set(every_labels):
            assert validation_labels.count(label) == 2  # 20% of each class's 10
        assert sorted(train_labels + validation_labels) == sorted(every_labels)
    again = validation_benchmark(benchmark, held_out=0.2, seed=0)
    assert torch.equal(images_and_labels(again.test_stream[1].dataset)[0],
                       images_and_labels(split.test_stream[1].dataset)[0])  # the same split for every method
    other = validation_benchmark(benchmark, held_out=0.2, seed=1)
    assert not torch.equal(images_and_labels(other.test_stream[1].dataset)[0],
                           images_and_labels(split.test_stream[1].dataset)[0])


@pytest.mark.parametrize("held_out", [0, 1, 1.5, "0.1"])
def test_a_held_out_fraction_outside_zero_to_one_is_refused_by_name(held_out):
    with pytest.raises(ValueError, match=rf"held_out must be a number in \(0, 1\), got {held_out!r}"):
        validation_benchmark(class_stream(), held_out=held_out)
    with pytest.raises(RunConfigError, match="held_out must be a number in"):
        RunConfig(benchmark="digits_class", held_out=held_out)


def test_every_method_that_trains_takes_the_grid_lr_with_the_best_validation_accuracy(tiny_backbone, tmp_path):
    config = RunConfig(benchmark="digits_class", methods=("CoLoR", "Naive", "NCM"), epochs=1, batch_size=64,
                       backbone=tiny_backbone, out=tmp_path, ranks=(2,), loggers=(), tune="lr",
                       lr_grid=(0.001, 0.1))
    result = run_comparison(config, progress=False)
    tuning = result["tuning"]
    assert tuning["grid"] == [0.001, 0.1] and tuning["seed"] == 0 and "validation" in tuning["rule"]
    assert sorted(tuning["choices"]) == ["CoLoR", "Naive"]  # NCM trains nothing by gradient
    runs = {run["label"]: run for run in result["runs"]}
    for name, choice in tuning["choices"].items():
        trials = {float(lr): accuracy for lr, accuracy in choice["trials"].items()}
        best = max(trials.values())
        assert choice["lr"] == min(lr for lr, accuracy in trials.items() if accuracy == best)
        assert runs[name]["lr"] == choice["lr"] and runs[name]["lr_chosen_by"].startswith("--tune lr")
    assert runs["NCM"]["lr"] is None
    assert json.loads((tmp_path / "results.json").read_text())["tuning"] == tuning
    summary = (tmp_path / "summary.md").read_text()
    assert "chosen by `--tune lr`" in summary and f"| CoLoR | {tuning['choices']['CoLoR']['lr']:g} (the grid's" in summary
    assert "chosen at an end of the grid, so the best lr may lie beyond it" in summary  # a 2-value grid: both ends


def test_a_choice_at_an_end_of_the_grid_is_marked_and_one_inside_is_not():
    from avalanche_color.runner.report import tuning_table

    def choice(lr):
        return {"lr": lr, "validation_accuracy": 0.5, "trials": {str(value): 0.5 for value in (0.01, 0.1, 1.0)}}

    tuning = {"tuned": "lr", "grid": [0.01, 0.1, 1.0], "held_out": 0.1, "seed": 0,
              "choices": {"Low": choice(0.01), "Middle": choice(0.1), "High": choice(1.0)}}
    table = tuning_table(tuning)
    assert "| Low | 0.01 (the grid's lowest) |" in table and "| High | 1 (the grid's highest) |" in table
    assert "| Middle | 0.1 |" in table
    assert table.endswith("Low, High: chosen at an end of the grid, so the best lr may lie beyond it (`--lr-grid` "
                          "tries others).")


def test_tuning_is_refused_under_torchrun():
    from avalanche_color.runner.comparison import check_distributed

    with pytest.raises(RunConfigError, match="tune is not supported under torchrun"):
        check_distributed(RunConfig(benchmark="digits_class", methods=("CoLoR",), tune="lr"))


def test_task_label_routing_is_tuned_on_a_validation_split_that_keeps_the_task_labels(tiny_backbone, tmp_path):
    config = RunConfig(benchmark="digits_class", methods=("CoLoR-oracle",), epochs=1, batch_size=64,
                       backbone=tiny_backbone, out=tmp_path, ranks=(2,), loggers=(), tune="lr", lr_grid=(0.05,))
    result = run_comparison(config, progress=False)  # the trials route by task label: they need them
    assert result["tuning"]["choices"]["CoLoR-oracle"]["lr"] == 0.05
    assert result["runs"][0]["routing_accuracy"] == 1.0
    labelled = validation_benchmark(class_stream(num_experiences=2, task_labels=True), 0.2)
    assert [experience.task_label for experience in labelled.test_stream] == [0, 1]


def test_a_head_that_grows_with_the_classes_is_tuned_on_experiences_that_name_their_classes(tiny_backbone,
                                                                                             tmp_path):
    config = RunConfig(benchmark="digits_domain", methods=("FT-masked",), epochs=1, batch_size=64,
                       backbone=tiny_backbone, out=tmp_path, loggers=(), tune="lr", lr_grid=(0.05,))
    result = run_comparison(config, progress=False)  # its IncrementalClassifier reads classes_in_this_experience
    assert result["tuning"]["choices"]["FT-masked"]["lr"] == 0.05
    benchmark = class_stream(num_experiences=2)
    split = validation_benchmark(benchmark, 0.2)
    for original, kept, held in zip(benchmark.train_stream, split.train_stream, split.test_stream):
        assert sorted(kept.classes_in_this_experience) == sorted(held.classes_in_this_experience) \
            == sorted(original.classes_in_this_experience)


def test_a_diverging_trial_loses_the_grid_goes_on_and_a_resume_keeps_it(tiny_backbone, tmp_path, monkeypatch):
    """An lr whose loss becomes non-finite (the strategies refuse it before the step) scores nothing: the other
    values are tried and one is chosen; its record says diverged, so --resume does not train it again."""
    import dataclasses

    from avalanche_color.runner.methods import REGISTRY
    from avalanche_color.runner.report import tuning_table

    config = RunConfig(benchmark="digits_class", methods=("CoLoR", "Naive"), epochs=1, batch_size=64,
                       backbone=tiny_backbone, out=tmp_path, ranks=(2,), loggers=(), tune="lr", lr_grid=(1e9, 0.05))

    def fails(run, options):
        raise RuntimeError("Naive fails after CoLoR's trials")

    monkeypatch.setitem(REGISTRY, "Naive", dataclasses.replace(REGISTRY["Naive"], build=fails))
    with pytest.raises(RuntimeError, match="Naive fails"):
        run_comparison(config, progress=False)
    record = json.loads((tmp_path / "attempt" / "tuning" / "runs" / "CoLoR_lr=1e+09_seed0.json").read_text())
    assert record["average_accuracy"] is None and record["diverged"].startswith("the training loss became [nan]")

    monkeypatch.undo()
    builds, color = [], REGISTRY["CoLoR"]

    def counted(run, options):
        builds.append(options["lr"])
        return color.build_strategy(run, options)

    monkeypatch.setitem(REGISTRY, "CoLoR", dataclasses.replace(color, build=counted))
    result = run_comparison(dataclasses.replace(config, resume=True), progress=False)
    choice = result["tuning"]["choices"]["CoLoR"]
    assert choice["lr"] == 0.05 and choice["trials"] == {"1e+09": None, "0.05": choice["validation_accuracy"]}
    assert builds == [0.05]  # the final run only: both trials were answered by their records
    assert "1e+09: diverged" in tuning_table(result["tuning"])


def test_resuming_a_completed_tuned_comparison_trains_nothing_again(tiny_backbone, tmp_path, monkeypatch):
    """The trials stay with the completed comparison: a --resume of it answers each from its record, where it
    would otherwise run the whole grid again (hours on a real backbone)."""
    import dataclasses

    from avalanche_color.runner.methods import REGISTRY

    config = RunConfig(benchmark="digits_class", methods=("Naive",), epochs=1, batch_size=64, backbone=tiny_backbone,
                       out=tmp_path, loggers=(), tune="lr", lr_grid=(0.003, 0.03), seeds=(0,), baseline_seeds=(0,))
    first = run_comparison(config, progress=False)

    def trains(run, options):
        raise AssertionError(f"trained again at lr {options['lr']}")

    monkeypatch.setitem(REGISTRY, "Naive", dataclasses.replace(REGISTRY["Naive"], build=trains))
    again = run_comparison(dataclasses.replace(config, resume=True), progress=False)
    assert again["tuning"] == first["tuning"] and again["runs"] == first["runs"]


def test_every_lr_diverging_is_refused_naming_the_grid_and_the_method(tiny_backbone, tmp_path):
    config = RunConfig(benchmark="digits_class", methods=("CoLoR",), epochs=1, batch_size=64, backbone=tiny_backbone,
                       out=tmp_path, ranks=(2,), loggers=(), tune="lr", lr_grid=(1e9,))
    with pytest.raises(FloatingPointError, match=r"every lr of --lr-grid \[1000000000\.0\] diverged for CoLoR"):
        run_comparison(config, progress=False)


def test_lr_from_carries_each_tuned_choice_to_another_budget_and_colors_to_its_variants(tiny_backbone, tmp_path):
    tuned = tmp_path / "tuned"
    settings = dict(benchmark="digits_class", batch_size=64, backbone=tiny_backbone, ranks=(2,), loggers=())
    first = run_comparison(RunConfig(**settings, methods=("CoLoR", "Naive"), epochs=1, out=tuned, tune="lr",
                                     lr_grid=(0.001, 0.1)), progress=False)
    choices = first["tuning"]["choices"]
    carried = run_comparison(RunConfig(**settings, methods=("CoLoR", "CoLoR-oracle", "Naive", "EWC", "NCM"),
                                       epochs=2, out=tmp_path / "longer", lr_from=(tuned,)), progress=False)
    runs = {run["label"]: run for run in carried["runs"]}
    for name, source in (("CoLoR", "CoLoR"), ("CoLoR-oracle", "CoLoR"), ("Naive", "Naive")):
        assert runs[name]["lr"] == choices[source]["lr"]
        assert runs[name]["lr_chosen_by"].startswith("--lr-from tuned (1 epochs, batch 64")
    assert runs["CoLoR-oracle"]["lr_chosen_by"] != runs["CoLoR"]["lr_chosen_by"]  # says whose choice it is
    # The tuned budget names the rank for a method that takes one only.
    assert "rank 2)" in runs["CoLoR"]["lr_chosen_by"] and "rank" not in runs["Naive"]["lr_chosen_by"]
    # Tuned nowhere: the untuned default of a backbone given as a weights file (runner/presets.UNTUNED_LRS).
    assert runs["EWC"]["lr"] == 1e-3 and runs["EWC"]["lr_chosen_by"].startswith("--baseline-lr")
    assert carried["config"]["lr_from"] == [str(tuned)]


def test_lr_from_refuses_a_folder_that_was_not_tuned_or_with_tune_before_writing(tiny_backbone, tmp_path):
    untuned = tmp_path / "untuned"
    settings = dict(benchmark="digits_class", backbone=tiny_backbone, loggers=(), epochs=1, methods=("NCM",))
    run_comparison(RunConfig(**settings, out=untuned), progress=False)
    for source, message in ((untuned, "must be a comparison run with --tune lr"),
                            (tmp_path / "absent", "must be a finished comparison's folder")):
        with pytest.raises(RunConfigError, match=message):
            run_comparison(RunConfig(**settings, out=tmp_path / "new", lr_from=(source,)), progress=False)
        assert not (tmp_path / "new").exists()
    with pytest.raises(RunConfigError, match="lr_from cannot be given with --tune lr"):
        RunConfig(**settings, out=tmp_path / "new", lr_from=(untuned,), tune="lr")
