import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# torch.use_deterministic_algorithms(True) makes cuBLAS raise on the first GEMM unless this is set before it
# (CUDA's reproducibility notes); set before any test touches CUDA. No effect on a CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
warnings.filterwarnings("ignore", message="no QP solver found")
# Under pytest-xdist (make test: -n auto) each worker takes its share of the cores: torch's default of one
# thread per core in every worker would oversubscribe them.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` run where CUDA exists and are skipped elsewhere (``pytest -m cuda`` selects them)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


TINY_VIT = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2)


@pytest.fixture(scope="session")
def tiny_backbone(tmp_path_factory) -> str:
    """A seeded 2-block timm ViT for 16 px images, saved as a backbone checkpoint file."""
    from helpers import saved_vit

    return saved_vit(tmp_path_factory.mktemp("backbone") / "tiny_vit.pt", **TINY_VIT)


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread (and the machine may be busy)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
