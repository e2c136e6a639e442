"""CL-LoRA under torchrun: 2 CPU processes (gloo) against one process on the same data, as SD-LoRA's and
InfLoRA's (lora_sum_torchrun.py): one full-experience batch per step. Outside DDP, each of its steps'
gradient lists is averaged over the ranks (the first experience's one step, then the distillation's and the
cross-entropy's two); the prototype pass runs over the experience's whole data on every rank."""

from __future__ import annotations

import pytest

from avalanche_color import CLLoRA
from lora_sum_torchrun import check_two_ranks_equal_one_process

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_two_processes_under_torchrun_equal_one_process(tmp_path_factory):
    # The second experience takes both steps: the distillation's reassigned gradient, then the rest.
    # (The 2 ranks: the CLLoRA case of lora_sum_torchrun.py's one torchrun launch.)
    check_two_ranks_equal_one_process(CLLoRA, tmp_path_factory)
