"""The result tables of the README and the docs pages are what the committed results files say."""

import json

from benchmarks.reporting.readme import DOCS, README, RESULTS, block_names, pages, render, stale_blocks, stale_pages, updated

HEADLINES = ["digits_class", "digits_domain", "pacs", "split_tiny_imagenet"]  # one per benchmark, in the README


def test_every_table_matches_its_results_file():
    assert README in pages() and DOCS / "benchmarks" / "index.md" in pages()
    assert stale_pages() == {}


def test_the_readme_has_the_headline_tables_and_the_benchmark_page_has_them_too():
    assert block_names(README.read_text()) == HEADLINES
    assert set(HEADLINES) <= set(block_names((DOCS / "benchmarks" / "index.md").read_text()))


def test_every_committed_result_has_a_table_in_the_docs():
    committed = {path.parent.name for path in RESULTS.glob("*/results.json")}
    shown = {name for page in pages() if page != README for name in block_names(page.read_text())}
    assert committed == shown


def test_a_block_is_rewritten_from_its_results_and_a_stale_one_is_found(tmp_path):
    run = {"label": "CoLoR", "method": "CoLoR", "seed": 0, "accuracy_matrix": [[0.5]], "average_accuracy": 0.5,
           "forgetting": 0.0, "routing_accuracy": 1.0, "trainable_parameters_per_experience": 10,
           "wall_seconds": 6.0, "cpu_seconds": 6.0}
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "results.json").write_text(json.dumps(
        {"config": {"command": "python -m benchmarks.compare --benchmark toy"}, "device": "cpu: AMD EPYC (x86_64), 1 thread; torch 2.14.1",
         "runs": [run]}))
    text = "intro\n<!-- results: toy -->\nold numbers\n<!-- end results -->\noutro\n"
    assert stale_blocks(text, tmp_path) == ["toy"]
    fresh = updated(text, tmp_path)
    assert fresh.startswith("intro\n") and fresh.endswith("<!-- end results -->\noutro\n")
    assert "OMP_NUM_THREADS=1 python -m benchmarks.compare --benchmark toy" in fresh  # as it ran
    assert "| CoLoR | 1 | 50.0 |" in fresh and "Made on cpu: AMD EPYC (x86_64), 1 thread" in fresh
    assert "minutes" not in fresh  # wall time differs between runs: not in the pages
    assert stale_blocks(fresh, tmp_path) == [] and render("toy", tmp_path) in fresh


def test_a_stale_table_in_a_docs_page_is_found(tmp_path):
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "README.md").write_text("no tables\n")
    (tmp_path / "docs" / "benchmarks" / "index.md").write_text("<!-- results: pacs -->\nold\n<!-- end results -->\n")
    assert stale_pages(tmp_path) == {"docs/benchmarks/index.md": ["pacs"]}


def test_an_across_block_sets_methods_side_by_side_from_the_first_folder_that_ran_them(tmp_path):
    from benchmarks.reporting.readme import across_names

    def run(method, accuracy, seed=0):
        return {"label": method, "method": method, "seed": seed, "accuracy_matrix": [[accuracy]],
                "average_accuracy": accuracy, "forgetting": 0.0, "routing_accuracy": None,
                "trainable_parameters_per_experience": 1, "wall_seconds": 1.0, "cpu_seconds": 1.0}

    for name, runs in {"a": [run("X", 0.5), run("X", 0.7, 1)], "b": [run("X", 0.1), run("Y", 0.2)], "c": [run("Y", 0.9)]}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(
            {"config": {"command": f"avalanche-color compare --name {name}"}, "device": "cpu: x, 1 thread", "runs": runs}))
    text = "<!-- across: one=a,b; two=c | X Y Z -->\nold\n<!-- end across -->\n"
    assert stale_blocks(text, tmp_path) == ["one=a,b; two=c"] and across_names(text) == ["a", "b", "c"]
    fresh = updated(text, tmp_path)
    assert "| X | 60.0 ± 14.1 (2) | - |" in fresh  # folder a ran X: b's X is not used
    assert "| Y | 20.0 (1) | 90.0 (1) |" in fresh and "| Z | - | - |" in fresh
    assert "OMP_NUM_THREADS=1 avalanche-color compare --name a\n" in fresh and "--name c" in fresh
    assert stale_blocks(fresh, tmp_path) == []
