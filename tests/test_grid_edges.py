"""The grid-edge check: past a tuned comparison's edge choices, the trials its own rule would have run
with a wider grid (tiny ViT, digits stream, CPU, seconds)."""

from __future__ import annotations

import json

import pytest

from avalanche_color.runner import RunConfig, run_comparison
from avalanche_color.runner.comparison import Choice
from benchmarks.investigations import grid_edges
from benchmarks.investigations.grid_edges import beyond, check_edges, edges_table

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_steps_continue_the_grids_own_spacing():
    default = [0.001, 0.003, 0.01, 0.03, 0.1]
    assert beyond(default, -1, 2) == [0.0003, 0.0001]
    assert beyond(default, 1, 3) == [0.3, 1.0, 3.0]
    assert beyond([0.1, 0.01], -1, 2) == [0.001, 0.0001]  # any order, one ratio
    assert beyond([0.001, 0.002, 0.01], 1, 1) == pytest.approx([0.0316228])  # no period: the geometric mean
    with pytest.raises(ValueError, match=r"grid must hold at least two learning rates .*got \[0.1\]"):
        beyond([0.1], 1, 1)


def tuned(folder, backbone, grid, methods=("Naive", "NCM")):
    config = RunConfig(benchmark="digits_class", methods=methods, epochs=1, batch_size=64, backbone=backbone,
                       out=folder, ranks=(2,), loggers=(), tune="lr", lr_grid=grid, seeds=(0,), baseline_seeds=(0,))
    return run_comparison(config, progress=False)


def test_a_trial_past_the_edge_is_the_one_a_wider_grid_would_have_run(tiny_backbone, tmp_path):
    result = tuned(tmp_path / "narrow", tiny_backbone, (0.003, 0.03))  # a two-value grid: both are edges
    naive = result["tuning"]["choices"]["Naive"]
    record = check_edges(tmp_path / "narrow", steps=1, scratch=tmp_path / "scratch", recheck=True, progress=False)
    assert list(record["methods"]) == ["Naive"]  # NCM is not tuned
    found = record["methods"]["Naive"]
    step = 0.0003 if naive["lr"] == 0.003 else 0.3  # one ratio of 10
    assert found["edge"] == ("lowest" if step < 0.003 else "highest") and list(found["beyond"]) == [f"{step:g}"]
    wider = tuned(tmp_path / "wider", tiny_backbone, (step,), methods=("Naive",))
    assert found["beyond"][f"{step:g}"] == wider["tuning"]["choices"]["Naive"]["trials"][f"{step:g}"]
    assert found["rerun"] == naive["validation_accuracy"]  # the same code and machine: the comparison's trial again
    assert json.loads((tmp_path / "narrow" / "grid_edges.json").read_text()) == record
    assert "| Naive |" in edges_table(record)


def tuned_naive(folder, backbone):
    """A comparison of Naive alone tuned on a two-value grid, and its choice."""
    tuned(folder, backbone, (0.01, 0.03), methods=("Naive",))
    return json.loads((folder / "results.json").read_text())["tuning"]["choices"]["Naive"]


def scripted_trials(monkeypatch, scores):
    """Trials that score ``scores`` in turn in place of training; returns the lrs asked for, in order."""
    scores, asked = iter(scores), []

    def scripted(config, ready, attempt, progress):
        (lr,) = config.lr_grid
        asked.append(lr)
        accuracy = next(scores)
        return {"Naive": Choice(lr, accuracy, {lr: accuracy})}

    monkeypatch.setattr(grid_edges, "tune_learning_rates", scripted)
    return asked


def test_it_goes_outwards_while_the_accuracy_rises_and_stops_where_it_falls(tiny_backbone, tmp_path, monkeypatch):
    start = tuned_naive(tmp_path / "narrow", tiny_backbone)["validation_accuracy"]
    asked = scripted_trials(monkeypatch, [start + 0.1, start + 0.2, start + 0.15, start + 0.3])
    record = check_edges(tmp_path / "narrow", steps=5, scratch=tmp_path / "scratch", progress=False)
    assert len(asked) == 3  # rose, rose, fell: the third is past the best
    assert list(record["methods"]["Naive"]["beyond"].values()) == pytest.approx([start + 0.1, start + 0.2,
                                                                                start + 0.15])
    assert f"+{100 * 0.2:.1f} at lr {asked[1]:g}" in edges_table(record)


def test_a_folder_without_tuning_or_an_untuned_method_is_refused_by_name(tiny_backbone, tmp_path):
    config = RunConfig(benchmark="digits_class", methods=("NCM",), epochs=1, batch_size=64, backbone=tiny_backbone,
                       out=tmp_path / "untuned", loggers=(), seeds=(0,))
    run_comparison(config, progress=False)
    with pytest.raises(ValueError, match="holds no tuned comparison .* run it with --tune lr"):
        check_edges(tmp_path / "untuned", progress=False)
    tuned_naive(tmp_path / "narrow", tiny_backbone)
    with pytest.raises(ValueError, match=r"methods \['EWC'\] were not tuned in .*: it tuned \['Naive'\]"):
        check_edges(tmp_path / "narrow", methods=["EWC"], progress=False)


def test_a_comparison_interrupted_after_its_tuning_is_read_from_its_finished_trials(tiny_backbone, tmp_path,
                                                                                    monkeypatch):
    """Edges show before the seeds' runs are spent: the choices read from the attempt's trials are those the
    completed comparison then reports."""
    from avalanche_color.runner import comparison
    from benchmarks.investigations.grid_edges import tuned_comparison

    real = comparison.run_method

    def interrupted(planned, benchmark, spec, backbone, config, device, folder, **options):
        if folder.name == "attempt":  # a seed's run, after every trial (those run in attempt/tuning)
            raise RuntimeError("interrupted after the tuning")
        return real(planned, benchmark, spec, backbone, config, device, folder, **options)

    monkeypatch.setattr(comparison, "run_method", interrupted)
    with pytest.raises(RuntimeError, match="interrupted after the tuning"):
        tuned(tmp_path / "running", tiny_backbone, (0.003, 0.03), methods=("Naive", "NCM"))
    monkeypatch.undo()
    settings, tuning, code = tuned_comparison(tmp_path / "running")
    assert settings["lr_grid"] == [0.003, 0.03] and list(tuning["choices"]) == ["Naive"]
    record = check_edges(tmp_path / "running", steps=1, scratch=tmp_path / "scratch", progress=False)
    assert list(record["methods"]) == ["Naive"] and record["comparison_code"] == code

    config = RunConfig(**{**settings, "methods": ("Naive", "NCM"), "out": tmp_path / "running", "loggers": (),
                          "seeds": (0,), "baseline_seeds": (0,), "resume": True})
    completed = run_comparison(config, progress=False)
    assert completed["tuning"]["choices"] == tuning["choices"]


def test_with_a_recheck_the_trials_beyond_are_held_against_the_rerun_of_the_same_code(tiny_backbone, tmp_path,
                                                                                     monkeypatch):
    choice = tuned_naive(tmp_path / "narrow", tiny_backbone)
    start = choice["validation_accuracy"]
    asked = scripted_trials(monkeypatch, [start - 0.1, start - 0.05, start - 0.08])  # rerun lower; step 1 beats it
    record = check_edges(tmp_path / "narrow", steps=5, scratch=tmp_path / "scratch", recheck=True, progress=False)
    assert asked[0] == choice["lr"] and len(asked) == 3  # the rerun first, then beyond until it falls
    found = record["methods"]["Naive"]
    assert found["rerun"] == pytest.approx(start - 0.1)
    assert f"+5.0 at lr {asked[1]:g}" in edges_table(record)


def test_checking_one_method_again_keeps_what_an_earlier_check_found_for_the_others(tiny_backbone, tmp_path,
                                                                                     monkeypatch):
    folder = tmp_path / "narrow"
    tuned(folder, tiny_backbone, (0.01, 0.03), methods=("Naive", "EWC"))
    first = check_edges(folder, steps=1, scratch=tmp_path / "scratch", progress=False)
    assert set(first["methods"]) == {"Naive", "EWC"}
    assert all({"code", "device"} <= set(found) for found in first["methods"].values())
    # a record written before each entry named its code and machine: they were named once, at the top
    older = {**first, "code": "older code", "device": "older machine",
             "methods": {name: {key: value for key, value in found.items() if key not in ("code", "device")}
                         for name, found in first["methods"].items()}}
    (folder / "grid_edges.json").write_text(json.dumps(older))
    asked = scripted_trials(monkeypatch, [0.0])
    again = check_edges(folder, steps=1, methods=["Naive"], scratch=tmp_path / "scratch", progress=False)
    assert len(asked) == 1 and again["methods"]["Naive"]["beyond"] == {f"{asked[0]:g}": 0.0}
    assert again["methods"]["EWC"] == {**older["methods"]["EWC"], "code": "older code", "device": "older machine"}
    assert list(again["methods"]) == ["Naive", "EWC"]  # the comparison's order
    rechecked = {**again, "methods": {**again["methods"], "EWC": {**again["methods"]["EWC"], "rerun": 0.5}}}
    assert "| tuned lr rerun |" in edges_table(rechecked)  # a partial recheck: the others' cells say "-"
    assert edges_table(rechecked).splitlines()[2].split(" | ")[3] == "-"
    # a check with other steps is another check: nothing earlier is kept
    scripted_trials(monkeypatch, [0.0, 0.0])
    other = check_edges(folder, steps=2, methods=["Naive"], scratch=tmp_path / "scratch", progress=False)
    assert list(other["methods"]) == ["Naive"]
