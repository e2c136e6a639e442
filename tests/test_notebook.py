"""The example notebook runs from top to bottom on a tiny configuration and shows its results."""

from __future__ import annotations

from pathlib import Path

import pytest

# Test-only dependencies (extra `test`): without them this module is skipped, so `pytest -m cuda` collects with
# the package's runtime dependencies alone.
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "compare_methods.ipynb"


def test_compare_methods_notebook_runs_and_shows_table_and_plot_in_a_folder_of_its_own(tiny_backbone, tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    [parameters] = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    parameters.source = (
        'BENCHMARK = "digits_class"\nMETHODS = ["CoLoR", "Naive"]\nSEEDS = [0]\nEPOCHS = 1\n'
        f'OPTIONS = {{"backbone": {tiny_backbone!r}, "ranks": (2,), "loggers": ()}}\n'
    )
    # Run where the notebook would be: it writes beside itself, never into the command line's runs/.
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    markdown = [output.data["text/markdown"] for output in outputs if "text/markdown" in output.get("data", {})]
    assert any("| CoLoR | 1 |" in text and "| Naive | 1 |" in text for text in markdown)
    assert any("image/png" in output.get("data", {}) for output in outputs)
    assert (tmp_path / "notebook_runs" / "digits_class" / "results.json").exists()
    assert not (tmp_path / "runs").exists()


def test_committed_notebook_shows_its_table_and_plot_and_defaults_to_an_offline_benchmark():
    """It reads on GitHub without running: committed with the outputs of its default configuration."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    [parameters] = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert 'BENCHMARK = "digits_class"' in parameters.source  # needs no data folder
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type in ("error", "stream")]  # no tracebacks, no noise
    assert any("| CoLoR | 1 |" in output.get("data", {}).get("text/markdown", "") for output in outputs)
    assert any("image/png" in output.get("data", {}) for output in outputs)
