"""Checkpoint and resume: round trips, refusals, atomic writes, determinism, and a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from avalanche_color import CheckpointError, ResumePlugin, SPrompts, TrainingProgress, read_checkpoint, train_stream
from avalanche_color.training.resume import read_header
from checkpointed_run import KILL_IN_EXPERIENCE, run
from helpers import quiet_evaluator, tiny_color, tiny_vit
from streams import class_stream

TESTS = Path(__file__).parent


pytestmark = pytest.mark.usefixtures("one_thread")


def trained_checkpoint(path: Path, experiences: int = 2, **options):
    strategy = tiny_color(train_epochs=2, k=2, **options)
    benchmark = class_stream(num_experiences=experiences, per_class=10)
    records = train_stream(strategy, benchmark, checkpoint=path)
    return strategy, benchmark, records


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_round_trip_restores_experts_prototypes_class_maps_and_records(tmp_path):
    path = tmp_path / "run.ckpt"
    strategy, benchmark, records = trained_checkpoint(path)
    checkpoint = read_checkpoint(path)
    assert (checkpoint.experiences_done, checkpoint.epochs_done) == (2, 0)
    assert checkpoint.records == records and len(records) == 2
    assert checkpoint.stream_classes == [[0, 1], [2, 3]]
    assert not any(k.startswith("backbone.") and ".experts." not in k for k in checkpoint.experts)

    fresh = tiny_color(train_epochs=2, k=2)
    plugin = ResumePlugin(path)
    plugin.resume(fresh, [[0, 1], [2, 3]])
    assert same_state(fresh.model.experts_state_dict(), strategy.model.experts_state_dict())
    assert plugin.records == records and plugin.experiences_done == 2
    images = torch.cat([torch.stack([s[0] for s in e.dataset]) for e in benchmark.test_stream])
    assert torch.equal(fresh.model.eval()(images), strategy.model.eval()(images))
    # Resuming a finished run trains nothing and gives back its records.
    again = tiny_color(train_epochs=2, k=2)
    assert train_stream(again, benchmark, checkpoint=path) == records


def test_checkpoint_is_small_without_the_backbone(tmp_path):
    path = tmp_path / "run.ckpt"
    strategy, _, _ = trained_checkpoint(path)
    backbone_bytes = sum(t.numel() * t.element_size() for k, t in strategy.model.state_dict().items()
                         if k not in strategy.model.experts_state_dict())
    assert path.stat().st_size < backbone_bytes / 2


@pytest.mark.parametrize("cut", ["inside the header", "half the payload", "one byte short"])
def test_truncated_checkpoint_is_refused_and_nothing_is_loaded(tmp_path, cut):
    path = tmp_path / "run.ckpt"
    trained_checkpoint(path)
    data = path.read_bytes()
    header_end = data.index(b"\n")
    keep = {"inside the header": header_end // 2, "half the payload": header_end + (len(data) - header_end) // 2,
            "one byte short": len(data) - 1}[cut]
    path.write_bytes(data[:keep])
    fresh = tiny_color(train_epochs=2, k=2)
    before = fresh.model.state_dict()
    message = "not an avalanche_color checkpoint" if cut == "inside the header" else "truncated or damaged"
    with pytest.raises(CheckpointError, match=message):
        ResumePlugin(path).resume(fresh)
    assert fresh.model.num_experts == 0 and same_state(fresh.model.state_dict(), before)


def test_corrupted_checkpoint_is_refused(tmp_path):
    path = tmp_path / "run.ckpt"
    trained_checkpoint(path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt: its payload does not match"):
        read_checkpoint(path)


def test_other_format_version_is_refused(tmp_path):
    path = tmp_path / "run.ckpt"
    trained_checkpoint(path)
    path.write_bytes(path.read_bytes().replace(b'"version": 2', b'"version": 1', 1))
    with pytest.raises(CheckpointError, match="format version 1; this avalanche_color reads version 2"):
        read_checkpoint(path)


def test_a_save_that_fails_midway_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    strategy, _, _ = trained_checkpoint(path)
    before = path.read_bytes()

    def crash(descriptor):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    plugin = ResumePlugin(path)
    plugin.experiences_done = 2
    with pytest.raises(OSError, match="disk full"):
        plugin.save(strategy)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]  # no temporary file left


@pytest.mark.parametrize("change, message", [
    (dict(vit_seed=1), r"backbone: the checkpoint's experts were trained on another backbone"),
    (dict(rank=2), r"rank: checkpoint 4, model 2"),
    (dict(routing_features="first_expert"), r"routing_features: checkpoint 'backbone', model 'first_expert'"),
    (dict(classes_per_experience=3), r"classes: the checkpoint's stream has classes \[\[0, 1\], \[2, 3\]\]"),
])
def test_refuses_a_checkpoint_of_another_backbone_rank_routing_or_class_set(tmp_path, change, message):
    path = tmp_path / "run.ckpt"
    trained_checkpoint(path)
    vit_seed = change.pop("vit_seed", 0)
    classes = change.pop("classes_per_experience", 2)
    strategy = tiny_color(seed=vit_seed, train_epochs=2, k=2, **change)
    before = strategy.model.state_dict()
    benchmark = class_stream(num_experiences=2, classes_per_experience=classes, per_class=10)
    with pytest.raises(CheckpointError, match=message):
        train_stream(strategy, benchmark, checkpoint=path)
    assert strategy.model.num_experts == 0 and same_state(strategy.model.state_dict(), before)
    assert strategy.plugins.count(None) == 0 and not any(isinstance(p, ResumePlugin) for p in strategy.plugins)


def test_refuses_to_resume_into_a_model_that_already_has_experts(tmp_path):
    path = tmp_path / "run.ckpt"
    strategy, _, _ = trained_checkpoint(path)
    with pytest.raises(ValueError, match="resume needs a fresh strategy whose model has no expert yet; this one has 2"):
        ResumePlugin(path).resume(strategy)


def test_same_seed_gives_identical_runs(tmp_path):
    first_records, first_state = run(tmp_path / "a.ckpt")
    second_records, second_state = run(tmp_path / "b.ckpt")
    assert first_records == second_records and same_state(first_state, second_state)


class CrashAfter(ResumePlugin.__mro__[1]):  # a SupervisedPlugin
    """Raises inside experience ``experience`` once ``epochs`` of its epochs are done."""

    def __init__(self, experience: int, epochs: int) -> None:
        super().__init__()
        self.experience, self.epochs, self.done = experience, epochs, 0

    def after_training_epoch(self, strategy, **kwargs):
        if strategy.experience.current_experience == self.experience:
            self.done += 1
            if self.done == self.epochs:
                raise KeyboardInterrupt("simulated crash")


def test_an_exception_mid_experience_then_resume_equals_an_uninterrupted_run(tmp_path):
    def strategy(*plugins):
        return tiny_color(train_epochs=3, train_mb_size=10, k=2, plugins=list(plugins))

    benchmark = class_stream(num_experiences=3, per_class=10)
    torch.manual_seed(0)
    expected = train_stream(strategy(), benchmark, checkpoint=tmp_path / "full.ckpt", every_n_epochs=1)
    full_state = read_checkpoint(tmp_path / "full.ckpt").experts

    path = tmp_path / "crashed.ckpt"
    torch.manual_seed(0)
    # CrashAfter comes before the ResumePlugin: its epoch 2 is not saved, epoch 1 is.
    with pytest.raises(KeyboardInterrupt):
        train_stream(strategy(CrashAfter(experience=1, epochs=2)), benchmark, checkpoint=path, every_n_epochs=1)
    assert (read_header(path)["experiences_done"], read_header(path)["epochs_done"]) == (1, 1)
    torch.manual_seed(123)  # whatever the new process does before, the checkpoint's RNG state wins
    resumed = strategy()
    assert train_stream(resumed, benchmark, checkpoint=path, every_n_epochs=1) == expected
    assert same_state(resumed.model.experts_state_dict(), full_state)


def test_a_resumed_run_counts_the_time_its_earlier_attempt_spent(tmp_path):
    benchmark = class_stream(num_experiences=3, per_class=10)
    path = tmp_path / "crashed.ckpt"
    with pytest.raises(KeyboardInterrupt):
        train_stream(tiny_color(train_epochs=3, train_mb_size=10, k=2, plugins=[CrashAfter(experience=1, epochs=2)]),
                     benchmark, checkpoint=path, every_n_epochs=1)
    crashed = read_checkpoint(path)
    assert crashed.cpu_seconds > 0 and crashed.wall_seconds > 0
    plugin = ResumePlugin(path, every_n_epochs=1)
    assert plugin.earlier_seconds == (0.0, 0.0)
    train_stream(tiny_color(train_epochs=3, train_mb_size=10, k=2), benchmark, checkpoint=plugin)
    assert plugin.earlier_seconds == (crashed.cpu_seconds, crashed.wall_seconds)
    finished = read_checkpoint(path)
    assert finished.cpu_seconds > crashed.cpu_seconds and finished.wall_seconds > crashed.wall_seconds


class ShownProgress(TrainingProgress):
    """What the bar shows at the start of each epoch: (experience, the epoch's label, the bar's total)."""

    def __init__(self) -> None:
        super().__init__("CoLoR", num_experiences=3)
        self.shown: list[tuple[int, str, int]] = []

    def before_training_epoch(self, strategy, **kwargs):
        super().before_training_epoch(strategy, **kwargs)
        self.shown.append((int(strategy.experience.current_experience), self.bar.postfix, self.bar.total))


def test_a_run_resumed_inside_an_experience_shows_the_epochs_left_named_as_in_the_whole_experience(tmp_path):
    benchmark = class_stream(num_experiences=3, per_class=10)
    path = tmp_path / "crashed.ckpt"
    with pytest.raises(KeyboardInterrupt):
        train_stream(tiny_color(train_epochs=3, train_mb_size=10, k=2, plugins=[CrashAfter(experience=1, epochs=2)]),
                     benchmark, checkpoint=path, every_n_epochs=1)
    progress = ShownProgress()
    train_stream(tiny_color(train_epochs=3, train_mb_size=10, k=2, plugins=[progress]), benchmark, checkpoint=path,
                 every_n_epochs=1)
    batches = 2  # 20 images of the experience's 2 classes, batches of 10
    # Experience 1 stopped after its first epoch: its bar counts the 2 epochs left, named 2 and 3 of 3.
    assert progress.shown == [(1, "epoch 2/3", 2 * batches), (1, "epoch 3/3", 2 * batches),
                              (2, "epoch 1/3", 3 * batches), (2, "epoch 2/3", 3 * batches),
                              (2, "epoch 3/3", 3 * batches)]


def test_s_prompts_resumes_mid_experience_as_if_uninterrupted(tmp_path):
    # The runner checkpoints S-Prompts as CoLoR (its long runs span sessions): the shared template's resume.
    def strategy(*plugins):
        return SPrompts(tiny_vit(0), prompt_length=2, k=2, lr=0.05, train_epochs=3, train_mb_size=10,
                        eval_mb_size=64, evaluator=quiet_evaluator(), plugins=list(plugins))

    benchmark = class_stream(num_experiences=3, per_class=10)
    torch.manual_seed(0)
    expected = train_stream(strategy(), benchmark, checkpoint=tmp_path / "full.ckpt", every_n_epochs=1)
    path = tmp_path / "crashed.ckpt"
    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        train_stream(strategy(CrashAfter(experience=1, epochs=2)), benchmark, checkpoint=path, every_n_epochs=1)
    torch.manual_seed(123)
    resumed = strategy()
    assert train_stream(resumed, benchmark, checkpoint=path, every_n_epochs=1) == expected
    assert same_state(resumed.model.experts_state_dict(), read_checkpoint(tmp_path / "full.ckpt").experts)


def test_sigkill_inside_experience_3_then_resume_gives_the_uninterrupted_results(tmp_path):
    checkpoint, marker = tmp_path / "killed.ckpt", tmp_path / "inside"
    process = subprocess.Popen([sys.executable, str(TESTS / "checkpointed_run.py"), str(checkpoint), str(marker)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            if process.poll() is not None:
                pytest.fail(f"the training process ended early: {process.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("the training process never reached experience 3")
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    header = read_header(checkpoint)
    assert header["experiences_done"] == KILL_IN_EXPERIENCE and header["epochs_done"] >= 2  # mid-experience

    resumed_records, resumed_state = run(checkpoint)
    expected_records, expected_state = run(tmp_path / "uninterrupted.ckpt")
    assert len(resumed_records) == 4 and resumed_records == expected_records
    assert same_state(resumed_state, expected_state)


def test_runner_resume_gives_the_uninterrupted_accuracy_matrix(tiny_backbone, tmp_path, monkeypatch):
    from avalanche_color import CoLoR
    from avalanche_color.runner import RunConfig, run_comparison

    def config(out, **overrides):
        return RunConfig(benchmark="digits_class", methods=("CoLoR",), epochs=2, batch_size=64,
                         backbone=tiny_backbone, out=out, ranks=(2,), loggers=(), checkpoint_epochs=1, **overrides)

    expected = run_comparison(config(tmp_path / "full"), progress=False)["runs"][0]

    original, calls = CoLoR.training_epoch, []

    def crash_in_experience_3(self, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # experience 3, second epoch (its first is checkpointed)
            raise KeyboardInterrupt("simulated crash")
        return original(self, **kwargs)

    monkeypatch.setattr(CoLoR, "training_epoch", crash_in_experience_3)
    with pytest.raises(KeyboardInterrupt):
        run_comparison(config(tmp_path / "resumed"), progress=False)
    monkeypatch.setattr(CoLoR, "training_epoch", original)
    # The interrupted comparison's checkpoints wait in its attempt folder; the folder has no results yet.
    header = read_header(tmp_path / "resumed" / "attempt" / "checkpoints" / "CoLoR_seed0.ckpt")
    assert not (tmp_path / "resumed" / "results.json").exists()
    assert (header["experiences_done"], header["epochs_done"]) == (2, 1)

    resumed = run_comparison(config(tmp_path / "resumed", resume=True), progress=False)["runs"][0]
    assert resumed["accuracy_matrix"] == expected["accuracy_matrix"]
    assert resumed["routing_accuracy"] == expected["routing_accuracy"]
    # A finished run is read back, not run again.
    monkeypatch.setattr(CoLoR, "training_epoch", None)
    again = run_comparison(config(tmp_path / "resumed", resume=True), progress=False)["runs"][0]
    assert again == resumed


def test_atomic_writes_get_the_permissions_a_plain_write_gets(tmp_path):
    from avalanche_color.utils.files import write_atomically

    (tmp_path / "plain").write_bytes(b"x")
    write_atomically(tmp_path / "atomic", b"x")
    assert (tmp_path / "atomic").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_the_plugin_is_named_apart_from_avalanches_checkpointing():
    """No public name of the package is one of Avalanche's checkpointing names (its CheckpointPlugin, deprecated
    since 0.5, or save_checkpoint / maybe_load_checkpoint): docs/guide/checkpoints.md."""
    import avalanche.checkpointing.checkpoint as functions
    import avalanche.training.plugins.checkpoint as deprecated

    import avalanche_color

    avalanche_names = {name for module in (functions, deprecated) for name in vars(module) if not name.startswith("_")}
    assert {"CheckpointPlugin", "save_checkpoint", "maybe_load_checkpoint"} <= avalanche_names
    assert set(avalanche_color.__all__) & avalanche_names == set()
