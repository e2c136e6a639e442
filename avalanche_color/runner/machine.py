"""One line naming the machine a figure was made on: results files and tables carry it."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name where the system tells it (Linux), else its processor, with its architecture and the
    vector instructions torch's CPU kernels use (AVX2, AVX512, ...): machines that differ there sum floats in
    another order, so their runs differ seed by seed, and a virtual machine may name its CPU by its family only."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name} ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()})"


def describe_machine(device: str | torch.device) -> str:
    """``"cpu: <model>, N thread(s); torch X"`` or ``"cuda: <GPU name>; torch X"``."""
    device = torch.device(device)
    if device.type == "cuda":
        where = f"cuda: {torch.cuda.get_device_name(device)}"
    else:
        threads = torch.get_num_threads()
        where = f"cpu: {cpu_model()}, {threads} thread{'s' if threads != 1 else ''}"
    return f"{where}; torch {torch.__version__}"
