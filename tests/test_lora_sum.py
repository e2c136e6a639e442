"""What SD-LoRA and InfLoRA share as package strategies, checked on each (tiny ViTs, CPU, seconds):
their options, resume, saved folders, dtypes, Avalanche's streams, torchrun and the runner."""

from __future__ import annotations

import pytest
import torch

import drop_in_cases
from avalanche_color import InfLoRA, InfLoRAConfig, InfLoRAViT, SDLoRA, SDLoRAConfig, SDLoRAViT
from avalanche_color.lora import trained_dtype
from avalanche_color.peers.lora_sum.model import LoRASumQKV, Mixing
from lora_sum_cases import (check_bad_options_are_refused, check_dtype, check_loader_options_reach_every_loader,
                            check_model_and_config_first_without_warnings,
                            check_online_stream_with_task_boundaries, check_pretrained_round_trip,
                            check_resume_equals_uninterrupted, check_signature_agrees_with_config,
                            check_the_runner_reports_what_the_first_experience_trains, drop_in_accuracy)
from lora_sum_torchrun import check_two_ranks_equal_one_process

pytestmark = pytest.mark.usefixtures("one_thread")

METHODS = {"SDLoRA": (SDLoRA, SDLoRAConfig, SDLoRAViT), "InfLoRA": (InfLoRA, InfLoRAConfig, InfLoRAViT)}
STRATEGIES = pytest.mark.parametrize("strategy", [SDLoRA, InfLoRA], ids=list(METHODS))


@pytest.mark.parametrize("strategy, config_class", [(s, c) for s, c, _ in METHODS.values()], ids=list(METHODS))
def test_signature_agrees_with_config(strategy, config_class):
    check_signature_agrees_with_config(strategy, config_class)


@STRATEGIES
def test_bad_options_are_refused_by_name(strategy):
    check_bad_options_are_refused(strategy)


@STRATEGIES
def test_resume_after_a_crash_mid_experience_equals_the_uninterrupted_run(strategy, tmp_path):
    check_resume_equals_uninterrupted(strategy, tmp_path)


@pytest.mark.parametrize("strategy, model_class", [(s, m) for s, _, m in METHODS.values()], ids=list(METHODS))
def test_save_pretrained_from_pretrained_predicts_identically(strategy, model_class, tmp_path):
    check_pretrained_round_trip(strategy, model_class, tmp_path)


@STRATEGIES
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_backbone_dtype(strategy, dtype, tmp_path):
    # Components, magnitudes and head float32 beside a bfloat16 or float16 ViT, float64 beside a float64 one.
    check_dtype(strategy, dtype, tmp_path, trained=trained_dtype(dtype))


@STRATEGIES
@pytest.mark.parametrize("stream", list(drop_in_cases.STREAMS))
def test_learns_every_stream_naive_runs(strategy, stream, tmp_path):
    assert drop_in_accuracy(strategy, stream, tmp_path) > drop_in_cases.LEARNED


@pytest.mark.slow
@STRATEGIES
def test_two_processes_under_torchrun_equal_one_process(strategy, tmp_path_factory):
    # The 2 ranks: the method's case of lora_sum_torchrun.py's one torchrun launch.
    check_two_ranks_equal_one_process(strategy, tmp_path_factory)


@STRATEGIES
def test_online_stream_with_task_boundaries_trains_one_component_per_experience(strategy, tmp_path):
    check_online_stream_with_task_boundaries(strategy, tmp_path)


@pytest.mark.parametrize("strategy, model_class", [(s, m) for s, _, m in METHODS.values()], ids=list(METHODS))
def test_the_model_and_the_config_come_first_silently(strategy, model_class):
    check_model_and_config_first_without_warnings(strategy, model_class)


@STRATEGIES
def test_loader_options_reach_every_loader(strategy, monkeypatch):
    check_loader_options_reach_every_loader(strategy, monkeypatch)


@STRATEGIES
def test_the_runner_reports_what_the_first_experience_trains(strategy):
    check_the_runner_reports_what_the_first_experience_trains(strategy)


@pytest.mark.parametrize("low_rank", [(), (0, 1)])
def test_a_float64_layer_adds_its_components_without_rounding_them_to_float32(low_rank):
    # The coefficients are float32 (a half-precision norm overflows); a float64 B must not be cut to them.
    torch.manual_seed(0)
    layer = LoRASumQKV(torch.nn.Linear(6, 18).double(), ("k", "v"))
    for _ in range(2):
        component = layer.add_component(2)
        with torch.no_grad():
            component.B.normal_(generator=torch.Generator().manual_seed(len(layer.components)))
            component.B.add_(1e-9)  # below float32's resolution at this scale
    x = torch.randn(5, 6, dtype=torch.float64)
    expected = layer.base_layer(x)
    for index, part in enumerate((1, 2)):  # k and v
        update = sum(x @ c.A[index].T @ c.B[index].T for c in layer.components)
        expected[:, part * 6:(part + 1) * 6] += update
    out = layer(x, Mixing(low_rank=frozenset(low_rank)))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
