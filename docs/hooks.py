"""mkdocs hook: the accuracy plots committed beside the results (``benchmarks/results/<name>/accuracy.png``)
are published as ``results/<name>/accuracy.png``, so the benchmark pages show them without a copy."""

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    results = Path(config["docs_dir"]).parent / "benchmarks" / "results"
    for plot in sorted(results.glob("*/accuracy.png")):
        files.append(File.generated(config, f"results/{plot.parent.name}/accuracy.png", abs_src_path=str(plot)))
    return files
