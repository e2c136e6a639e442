"""The runner's baselines (FT-masked, NCM, RanPAC) and upper bounds (Joint-FT, Joint-LoRA), and its presets.

Tiny seeded ViTs on synthetic streams (seconds on CPU), and the runner on the bundled digits.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from avalanche.core import SupervisedPlugin
from avalanche.models import NCMClassifier
from avalanche.training import JointTraining, Naive
from torch import nn

import avalanche_color.runner.cli as command_line
import avalanche_color.runner.comparison as comparison
from avalanche_color.baselines import SeenClassesNCM
from avalanche_color.benchmarks import benchmark_spec
from avalanche_color.runner import RunConfig, RunConfigError, run_comparison
from avalanche_color.runner.backbone_loading import with_head
from avalanche_color.runner.comparison import plan_runs
from avalanche_color.runner.config import config_record
from avalanche_color.runner.presets import PAPER
from avalanche_color.runner.report import seen_accuracy_curve
from avalanche_color.runner.run import build_method, trainable_parameters_per_experience
from streams import class_stream, domain_stream, tiny_vit


class Recorder(SupervisedPlugin):
    """The logits and labels of every training step, per training experience."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    def before_training_exp(self, strategy, **kwargs):
        self.outputs.append([])

    def after_forward(self, strategy, **kwargs):
        self.outputs[-1].append((strategy.mb_output.detach().clone(), strategy.mb_y.clone()))


def strategy_for(method: str, vit: nn.Module, num_classes: int, epochs: int = 1, batch_size: int = 16,
                 rank: int = 16, **settings):
    config = RunConfig(benchmark="digits_class", epochs=epochs, batch_size=batch_size, ranks=(rank,), **settings)
    return build_method(method, config, lambda classes: with_head(copy.deepcopy(vit), classes), num_classes)


def accuracy(strategy, stream) -> float:
    return strategy.eval(stream)["Top1_Acc_Stream/eval_phase/test_stream/Task000"]


def test_ft_masked_trains_only_the_current_classes_logits_and_learns(one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=1)
    strategy = strategy_for("FT-masked", tiny_vit(), 4, epochs=5, batch_size=8, baseline_lr=1e-3)
    assert isinstance(strategy, Naive)
    recorder = Recorder()
    strategy.plugins.append(recorder)
    strategy.train(benchmark.train_stream[0])
    assert accuracy(strategy, benchmark.test_stream[:1]) > 0.9  # chance: 0.5
    strategy.train(benchmark.train_stream[1])
    for experience, steps in zip(benchmark.train_stream, recorder.outputs):
        current = sorted(experience.classes_in_this_experience)
        outside = [c for c in range(4) if c not in current]
        for logits, _ in steps:
            assert torch.isneginf(logits[:, outside]).all()  # -inf outside the current experience
            assert torch.isfinite(logits[:, current]).all()
    # Evaluation sees every class trained so far: none is masked after both experiences.
    strategy.model.eval()
    data = benchmark.test_stream[1].dataset
    x = torch.stack([data[i][0] for i in range(len(data))])
    y = torch.tensor([int(data[i][1]) for i in range(len(data))])
    with torch.no_grad():
        logits = strategy.model(x)
    assert torch.isfinite(logits).all()
    assert (logits[:, 2:].argmax(dim=1) + 2 == y).float().mean() > 0.9  # learned the second experience's classes
    assert accuracy(strategy, benchmark.test_stream) > 0.5  # chance: 0.25
    assert trainable_parameters_per_experience(strategy) == sum(p.numel() for p in strategy.model.parameters())


@pytest.mark.parametrize("method, hp", [("Joint-FT", dict(baseline_lr=3e-4)),
                                        ("Joint-LoRA", dict(color_lr=0.1, rank=2))])
def test_joint_methods_train_once_on_every_class(method, hp, one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=2)
    vit = tiny_vit()
    strategy = strategy_for(method, vit, 4, epochs=5, batch_size=8, **hp)
    assert isinstance(strategy, JointTraining)
    recorder = Recorder()
    strategy.plugins.append(recorder)
    strategy.train(benchmark.train_stream)
    assert len(recorder.outputs) == 1  # one training, on the union of the experiences
    labels = torch.cat([y for _, y in recorder.outputs[0]])
    assert labels.unique().tolist() == [0, 1, 2, 3] and len(labels) == 5 * 2 * 2 * 20  # epochs x all data
    for logits, _ in recorder.outputs[0]:
        assert logits.shape[1] == 4 and torch.isfinite(logits).all()
    assert accuracy(strategy, benchmark.test_stream) > 0.8  # chance: 0.25
    if method == "Joint-LoRA":  # one CoLoR expert over every class; the backbone frozen
        expert_vit = strategy.model.experts
        assert expert_vit.num_experts == 1 and expert_vit.bank.heads[0].classes.tolist() == [0, 1, 2, 3]
        lora, head = 2 * 2 * 2 * (32 + 32), 32 * 4 + 4  # depth x (q, v) x r x (in + out); 4 classes
        assert trainable_parameters_per_experience(strategy) == lora + head
        untouched = {k: v for k, v in vit.state_dict().items()}
        trained = {k.replace("base_layer.", ""): v for k, v in expert_vit.backbone.state_dict().items()
                   if ".experts." not in k}
        assert all(torch.equal(untouched[k], trained[k]) for k in untouched)


def test_ncm_changes_no_weight_and_classifies_by_class_means(one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=3)
    vit = tiny_vit()
    strategy = strategy_for("NCM", vit, 4, epochs=2)
    before = copy.deepcopy(strategy.model.state_dict())
    for experience in benchmark.train_stream:
        strategy.train(experience)
    after = strategy.model.state_dict()
    backbone = [k for k in before if k.startswith("backbone.")]
    assert backbone and all(torch.equal(before[k], after[k]) for k in backbone)  # bit-identical
    assert trainable_parameters_per_experience(strategy) == 0
    assert accuracy(strategy, benchmark.test_stream) > 0.8  # chance: 0.25


def test_ncm_predicts_only_classes_with_a_mean():
    # Avalanche's NCMClassifier gives class ids below the largest seen a zero mean, at distance 1
    # from every normalised feature: here nearer than either real mean.
    ncm = SeenClassesNCM(normalize=True)
    ncm.update_class_means_dict({2: torch.tensor([1.0, 0.0, 0.0]), 3: torch.tensor([0.0, 1.0, 0.0])})
    scores = ncm(torch.tensor([[0.1, 0.0, 1.0]]))
    assert torch.isneginf(scores[0, :2]).all() and scores.argmax().item() == 2
    assert NCMClassifier.forward(ncm, torch.tensor([[0.1, 0.0, 1.0]])).argmax().item() in (0, 1)


def test_ncm_means_cover_all_the_training_data_seen(one_thread):
    """In a domain-incremental stream a class comes back: its mean is over every domain, exactly."""
    benchmark = domain_stream(num_domains=2, num_classes=3, seed=4)
    vit = tiny_vit()
    strategy = strategy_for("NCM", vit, 3)
    for experience in benchmark.train_stream:
        strategy.train(experience)
    vit.eval()
    with torch.no_grad():
        data = [experience.dataset[i] for experience in benchmark.train_stream for i in range(len(experience.dataset))]
        features = nn.functional.normalize(vit(torch.stack([x for x, *_ in data])), dim=-1)
        labels = torch.tensor([int(y) for _, y, *_ in data])
    means = strategy.model.classifier.class_means
    for label in range(3):
        expected = nn.functional.normalize(features[labels == label].mean(dim=0), dim=0)
        assert torch.allclose(means[label], expected, atol=1e-5)


def test_runner_reports_joint_runs_as_one_row(tiny_backbone, tmp_path):
    config = RunConfig(benchmark="digits_class", methods=("Joint-FT", "Joint-LoRA", "NCM", "FT-masked"),
                       epochs=1, batch_size=64, backbone=tiny_backbone, out=tmp_path, ranks=(2,), loggers=())
    runs = {run["label"]: run for run in run_comparison(config, progress=False)["runs"]}
    for label in ("Joint-FT", "Joint-LoRA"):
        matrix = runs[label]["accuracy_matrix"]
        # One training on every experience, then one evaluation on the whole test stream: one row.
        assert len(matrix) == 1 and all(a is not None for a in matrix[0]) and len(matrix[0]) == 5
        assert runs[label]["forgetting"] == 0.0
        assert seen_accuracy_curve(matrix) == [pytest.approx(sum(matrix[0]) / 5)]
    assert runs["Joint-LoRA"]["rank"] == 2 and runs["Joint-FT"]["rank"] is None
    assert runs["Joint-LoRA"]["trainable_parameters_per_experience"] == 2 * 2 * 2 * 64 + 32 * 10 + 10
    assert runs["NCM"]["trainable_parameters_per_experience"] == 0
    assert len(runs["NCM"]["accuracy_matrix"]) == len(runs["FT-masked"]["accuracy_matrix"]) == 5
    assert (tmp_path / "accuracy.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "accuracy_matrices.csv").read_text().count("\n") == 1 + 2 * 5 + 2 * 15


def test_plan_runs_baselines_for_the_baseline_seeds_and_joint_lora_for_every_rank():
    config = RunConfig(benchmark="digits_class", methods=("CoLoR", "NCM", "Joint-LoRA"), seeds=(0, 1), ranks=(1, 8))
    plan = [(label, seed, rank) for _, label, seed, rank, _ in plan_runs(config, benchmark_spec("digits_class"))]
    assert plan[4:] == [("NCM", 0, None), ("Joint-LoRA r=1", 0, 1), ("Joint-LoRA r=8", 0, 8)]


def test_paper_preset_settings_and_explicit_flags_over_them(monkeypatch):
    configs = []
    monkeypatch.setattr(comparison, "run_comparison",
                        lambda config, progress: configs.append(config) or {"table": ""})
    command_line.main(["compare", "--benchmark", "core50", "--preset", "paper", "--data", "unused", "--epochs", "3"])
    config = configs[-1]
    assert (config.preset, config.epochs) == ("paper", 3)  # the flag given overrides the preset
    assert (config.ranks, config.ks, config.batch_size, config.color_lr, config.weight_decay, config.backbone) == (
        (64,), (5,), 128, 0.02, 2e-4, "vit_base_patch16_224.augreg_in21k")
    assert config_record(config)["preset_settings"] == json.loads(json.dumps(PAPER["core50"]))
    command_line.main(["compare", "--benchmark", "split_cifar100", "--preset", "paper", "--data", "unused"])
    assert (configs[-1].epochs, configs[-1].color_lr, configs[-1].ks) == (50, 0.01, (20,))
    command_line.main(["compare", "--benchmark", "domainnet", "--data", "unused"])  # no preset: the runner's defaults
    assert (configs[-1].preset, configs[-1].ranks, configs[-1].weight_decay) == (None, (8,), None)


def test_the_paper_preset_gives_the_offline_streams_the_protocol_of_the_papers_benchmark_of_their_kind():
    pacs = RunConfig.from_preset("paper", benchmark="pacs", backbone="offline")
    tiny = RunConfig.from_preset("paper", benchmark="split_tiny_imagenet", epochs=10)
    for config, benchmark in ((pacs, "domainnet"), (tiny, "split_cifar100")):
        paper = PAPER[benchmark]
        assert (config.ranks, config.ks, config.batch_size, config.weight_decay, config.color_lr) == (
            paper["ranks"], paper["ks"], paper["batch_size"], paper["weight_decay"], paper["color_lr"])
        assert config.augmentation == "paper" and config.normalisation == "backbone"
    assert (pacs.epochs, pacs.backbone, tiny.epochs) == (50, "offline", 10)


def test_a_benchmark_without_the_preset_is_refused():
    with pytest.raises(SystemExit) as refused:
        command_line.main(["compare", "--benchmark", "digits_class", "--preset", "paper"])
    assert str(refused.value) == ("avalanche-color compare: error: --preset paper: has no settings for benchmark "
                                  "'digits_class': it has them for ['core50', 'domainnet', 'pacs', "
                                  "'split_cifar100', 'split_tiny_imagenet']")
    with pytest.raises(RunConfigError, match="no settings for benchmark 'digits_class'"):
        RunConfig.from_preset("paper", benchmark="digits_class")


def test_preset_values_land_in_results_json(tiny_backbone, tmp_path, monkeypatch):
    # A preset for the digits (the paper's benchmarks need their data): the runner end to end.
    monkeypatch.setitem(PAPER, "digits_class", dict(epochs=2, batch_size=64, ranks=(2,), weight_decay=1e-3))
    command_line.main(["compare", "--benchmark", "digits_class", "--preset", "paper", "--methods", "NCM",
                       "--epochs", "1", "--backbone", tiny_backbone, "--name", "preset", "--loggers",
                       "--out-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "preset" / "results.json").read_text())["config"]
    assert saved["preset"] == "paper"
    assert saved["preset_settings"] == {"epochs": 2, "batch_size": 64, "ranks": [2], "weight_decay": 1e-3}
    assert (saved["epochs"], saved["batch_size"], saved["weight_decay"]) == (1, 64, 1e-3)


def test_ranpac_changes_no_weight_and_equals_one_ridge_solve_on_all_data_seen(one_thread):
    benchmark = class_stream(num_experiences=2, classes_per_experience=2, seed=3)
    vit = tiny_vit()
    strategy = strategy_for("RanPAC", vit, 6, epochs=2)
    before = copy.deepcopy(vit.state_dict())
    strategy.train(benchmark.train_stream[0])
    images = torch.stack([sample[0] for sample in benchmark.test_stream[1].dataset])
    model = strategy.model.eval()
    with torch.no_grad():
        scores = model(images)
    # After the first experience the scores cover its classes (0, 1) alone (tests/test_baseline_strategies.py:
    # a class of a later experience scores -inf once an evaluation has shown it).
    assert scores.shape == (len(images), 2) and torch.isfinite(scores).all()
    strategy.train(benchmark.train_stream[1])
    assert all(torch.equal(before[k], v) for k, v in model.backbone.state_dict().items())
    assert trainable_parameters_per_experience(strategy) == 0
    assert accuracy(strategy, benchmark.test_stream) > 0.8  # chance: 0.25
    with torch.no_grad():  # the accumulated statistics equal those of all the data seen at once
        data = [experience.dataset[i] for experience in benchmark.train_stream for i in range(len(experience.dataset))]
        expanded = model.ridge.expand(vit(torch.stack([x for x, *_ in data]))).double()
        labels = torch.tensor([int(y) for _, y, *_ in data])
    torch.testing.assert_close(model.ridge.gram, expanded.T @ expanded)
    torch.testing.assert_close(model.ridge.moments, expanded.T @ nn.functional.one_hot(labels).double())
