"""The paper's three benchmarks end to end through the comparison runner, on tiny fake copies of
their data sets in the real on-disk formats, with a tiny random ViT (seconds each on CPU)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from avalanche_color import read_checkpoint

from avalanche_color.benchmarks import benchmark_spec
from avalanche_color.benchmarks.paper import DOMAINNET_DOMAINS
from avalanche_color.runner import METHODS, RunConfig, run_comparison
from avalanche_color.runner.methods import methods_allowed
from helpers import saved_vit
from paper_data import use_md5_sums, write_cifar100, write_core50, write_domainnet

SMALL_VIT = dict(img_size=32, patch_size=16, embed_dim=16, depth=1, num_heads=2)


@pytest.fixture(scope="module")
def small_backbone(tmp_path_factory) -> str:
    """A seeded 1-block timm ViT for 32 px images (the fake data sets' size), saved as a backbone file."""
    return saved_vit(tmp_path_factory.mktemp("backbone") / "small_vit.pt", **SMALL_VIT)


def fake_data(benchmark: str, root: Path, monkeypatch) -> Path:
    """The benchmark's fake data set under ``root``."""
    if benchmark == "split_cifar100":
        use_md5_sums(monkeypatch, write_cifar100(root))
    elif benchmark == "core50":
        write_core50(root, objects=3)
    else:
        write_domainnet(root, DOMAINNET_DOMAINS)
    return root


def config(benchmark: str, data: Path, backbone: str, out: Path, **overrides) -> RunConfig:
    # k=2 and a narrow ridge keep the k-means and the ridge solves cheap on a few fake images.
    settings = dict(benchmark=benchmark, methods=methods_allowed(benchmark_spec(benchmark)), epochs=1, batch_size=32,
                    backbone=backbone, data=data, out=out, ranks=(2,), ks=(2,), ridge_width=64, loggers=())
    return RunConfig(**{**settings, **overrides})


@pytest.mark.parametrize("benchmark", ["split_cifar100", "core50", "domainnet"])
def test_every_allowed_method_runs_to_the_end(benchmark, small_backbone, tmp_path, monkeypatch, one_thread):
    data = fake_data(benchmark, tmp_path / "data", monkeypatch)
    result = run_comparison(config(benchmark, data, small_backbone, tmp_path / "out"), progress=False)
    runs = {run["label"]: run for run in result["runs"]}
    assert list(runs) == list(methods_allowed(benchmark_spec(benchmark)))
    tests = {"split_cifar100": 10, "core50": 1, "domainnet": 6}[benchmark]
    trains = {"split_cifar100": 10, "core50": 8, "domainnet": 6}[benchmark]
    for run in runs.values():
        assert math.isfinite(run["average_accuracy"]) and 0.0 <= run["average_accuracy"] <= 1.0
        assert math.isfinite(run["forgetting"]) and -1.0 <= run["forgetting"] <= 1.0
        rows = 1 if run["method"] in ("Joint-FT", "Joint-LoRA") else trains
        assert len(run["accuracy_matrix"]) == rows and all(len(row) == tests for row in run["accuracy_matrix"])
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [run["label"] for run in saved["runs"]] == list(runs)
    routed = runs["CoLoR"]["routing_accuracy"]
    if benchmark == "core50":  # held-out sessions: no expert is the right one, nothing to report
        assert routed is None and "CoLoR-oracle" not in runs
        assert "| CoLoR | 1 | " in (tmp_path / "out" / "summary.md").read_text()
        matrix = runs["CoLoR"]["accuracy_matrix"]
        assert runs["CoLoR"]["forgetting"] == pytest.approx(matrix[0][0] - matrix[-1][0])
    else:
        assert 0.0 <= routed <= 1.0 and runs["CoLoR-oracle"]["routing_accuracy"] == 1.0


def test_core50_refuses_oracle_routing_before_any_run(tmp_path):
    from avalanche_color.runner.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["compare", "--benchmark", "core50", "--data", str(tmp_path), "--methods", "CoLoR", "CoLoR-oracle",
              "--out-dir", str(tmp_path / "runs")])
    error = str(refused.value)
    assert error.startswith("avalanche-color compare: error: --methods CoLoR CoLoR-oracle: cannot hold "
                            "['CoLoR-oracle'] on benchmark 'core50'") and "no task label" in error
    assert "\n" not in error and not (tmp_path / "runs").exists()
    assert set(methods_allowed(benchmark_spec("core50"))) == set(METHODS) - {"CoLoR-oracle"}
    assert methods_allowed(benchmark_spec("domainnet")) == tuple(METHODS)


def test_an_interrupted_core50_comparison_resumes_to_the_uninterrupted_results(small_backbone, tmp_path,
                                                                                monkeypatch, one_thread):
    from avalanche_color.runner.methods import REGISTRY

    data = fake_data("core50", tmp_path / "data", monkeypatch)
    methods = ("NCM", "CoLoR", "CoLoR++")  # CoLoR++ is evaluated on CoLoR's experts
    expected = run_comparison(config("core50", data, small_backbone, tmp_path / "whole", methods=methods),
                              progress=False)["runs"]
    # CORe50's one test set, evaluated whole after every session: the follower's records are its own training's.
    [alone] = run_comparison(config("core50", data, small_backbone, tmp_path / "alone", methods=("CoLoR++",)),
                             progress=False)["runs"]
    assert expected[2]["trained_by"] == "CoLoR" and expected[2]["accuracy_matrix"] == alone["accuracy_matrix"]

    entry = REGISTRY["CoLoR"]

    def interrupted(run, options):  # CoLoR stops while training its third session
        strategy = entry.build_strategy(run, options)
        train, calls = strategy.train, []

        def train_until_interrupted(*train_args, **train_kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return train(*train_args, **train_kwargs)
        strategy.train = train_until_interrupted
        return strategy

    out = tmp_path / "interrupted"
    monkeypatch.setitem(REGISTRY, "CoLoR", dataclasses.replace(entry, build=interrupted))
    with pytest.raises(KeyboardInterrupt):
        run_comparison(config("core50", data, small_backbone, out, methods=methods), progress=False)
    first = json.loads((out / "attempt" / "runs" / "NCM_seed0.json").read_text())
    assert not (out / "results.json").exists() and (out / "attempt" / "checkpoints" / "CoLoR_seed0.ckpt").exists()

    spent = read_checkpoint(out / "attempt" / "checkpoints" / "CoLoR_seed0.ckpt").cpu_seconds

    monkeypatch.setitem(REGISTRY, "CoLoR", entry)
    resumed = run_comparison(config("core50", data, small_backbone, out, methods=methods, resume=True),
                             progress=False)["runs"]
    assert resumed[0] == first  # read back, not run again
    assert resumed[1]["cpu_seconds"] > spent > 0  # the whole run's cost: the interrupted attempt's too
    for run, whole in zip(resumed, expected):
        assert run["accuracy_matrix"] == whole["accuracy_matrix"]
        assert run["forgetting"] == pytest.approx(whole["forgetting"])
        assert run["average_accuracy"] == pytest.approx(whole["average_accuracy"])
    assert json.loads((out / "results.json").read_text())["runs"] == json.loads(json.dumps(resumed))


@pytest.mark.parametrize("benchmark, lr, epochs, k", [("split_cifar100", 0.01, 50, 20), ("core50", 0.02, 20, 5),
                                                      ("domainnet", 1e-3, 50, 5)])
def test_the_paper_preset_trains_and_feeds_colour_as_its_table_says(benchmark, lr, epochs, k, small_backbone,
                                                                       tmp_path, monkeypatch):
    from avalanche_color.runner.backbone_loading import load_backbone
    from avalanche_color.runner.presets import PAPER_PIPELINE
    from avalanche_color.runner.run import build_method, build_stream

    data = fake_data(benchmark, tmp_path / "data", monkeypatch)
    preset = RunConfig.from_preset("paper", benchmark=benchmark, data=data, backbone=small_backbone)
    assert (preset.color_lr, preset.epochs, preset.ks, preset.ranks, preset.batch_size, preset.weight_decay) == (
        lr, epochs, (k,), (64,), 128, 2e-4)
    table = {setting: value for setting, value, _ in PAPER_PIPELINE}
    assert "SGD, momentum 0.9" == table["optimiser"] and "2e-4" == table["weight decay"]
    strategy = build_method("CoLoR", preset, lambda classes: load_backbone(small_backbone), 10)
    options = strategy.config
    assert (options.lr, options.momentum, options.weight_decay, options.rank, options.k) == (lr, 0.9, 2e-4, 64, k)
    assert (strategy.train_mb_size, strategy.train_epochs) == (128, epochs)
    built = []
    spec = dataclasses.replace(benchmark_spec(benchmark), build=built.append)
    build_stream(spec, preset, load_backbone(small_backbone), 0, False)
    request = built[0]  # ImageNet's mean and std, the ViT's size
    assert (request.data, request.image_size, request.mean, request.std) == (
        data, 32, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    build_stream(spec, dataclasses.replace(preset, normalisation="backbone"), load_backbone(small_backbone), 0, False)
    assert (built[1].mean, built[1].std) == ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # timm's cfg of vit_tiny_patch16_224


def test_the_docs_show_the_paper_pipeline_table():
    from benchmarks import REPOSITORY
    from avalanche_color.runner.presets import pipeline_table

    assert pipeline_table() in (REPOSITORY / "docs" / "benchmarks" / "runner.md").read_text()
