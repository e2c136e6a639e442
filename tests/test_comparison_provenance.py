"""--resume reuses a folder's runs only when the same settings, weights and code made them."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from benchmarks.compare import ComparisonConfig
from benchmarks.compare.provenance import claim_folder, provenance


def record(model=None, **settings):
    torch.manual_seed(0)
    config = ComparisonConfig(benchmark="digits_class", loggers=(), **settings)
    return provenance(config, model or nn.Linear(3, 2), "cpu")


def test_what_a_run_computes_changes_the_record_and_what_selects_runs_does_not():
    base = record()
    assert record(methods=("CoLoR",), seeds=(0, 1), resume=True, command="x") == base
    assert record(epochs=3)["settings"] != base["settings"]
    assert record(color_lr=0.1)["settings"] != base["settings"]
    other_weights = nn.Linear(3, 2)
    with torch.no_grad():
        other_weights.weight.add_(1e-6)
    assert record(other_weights)["backbone"] != base["backbone"]


def test_resume_refuses_runs_made_with_other_settings(tmp_path):
    claim_folder(tmp_path, record(epochs=2), resume=False)
    (tmp_path / "runs" / "CoLoR_seed0.json").write_text("{}")
    claim_folder(tmp_path, record(epochs=2), resume=True)  # the same: reused
    assert (tmp_path / "runs" / "CoLoR_seed0.json").exists()
    with pytest.raises(ValueError, match="different settings; run without --resume"):
        claim_folder(tmp_path, record(epochs=3), resume=True)


def test_resume_refuses_runs_that_do_not_say_what_made_them(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "CoLoR_seed0.json").write_text("{}")
    with pytest.raises(ValueError, match="do not say what produced them"):
        claim_folder(tmp_path, record(), resume=True)


def test_a_fresh_start_clears_earlier_runs_and_checkpoints_and_stamps_the_folder(tmp_path):
    for stale in ("runs/CoLoR_seed0.json", "checkpoints/CoLoR_seed0.ckpt"):
        (tmp_path / stale).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / stale).write_text("old")
    claim_folder(tmp_path, record(), resume=False)
    assert not (tmp_path / "checkpoints").exists()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["provenance.json"]
    assert json.loads((tmp_path / "runs" / "provenance.json").read_text()) == record()
