"""The tables of the README and the docs pages, written from the committed results files and the code, never by hand.

    python -m benchmarks.reporting.readme            # rewrite every table in README.md and docs/
    python -m benchmarks.reporting.readme --check    # exit 1 if a table differs from its results

A table's place in a page (``README.md`` or any ``docs/**/*.md``) is marked by a pair of comments
naming its results folder (``benchmarks/results/<name>/results.json``, written by
``python -m benchmarks.compare``)::

    <!-- results: digits_class -->
    ...
    <!-- end results -->

Between them goes the command that produced the results (on a CPU, with the thread count it ran
with), the table (without wall time, which differs between runs), and the machine it ran on. The
same results folder may have a block in several pages (the README's headline tables are also in
the docs' benchmark pages); each is written the same way.

A second kind of block sets methods side by side across benchmarks, each cell the method's
average accuracy (mean ± std over seeds, and the seed count) from the first listed results folder
of that benchmark that ran it::

    <!-- across: pacs=pacs_lora_peers,pacs_routers; split_tiny_imagenet=... | SD-LoRA InfLoRA RanPAC -->
    ...
    <!-- end across -->

It is written with the commands of the folders it read, so every number has its command.

A third kind is the table of the runner's methods, written from its registry
(``avalanche_color.runner.methods.REGISTRY``), so a method registered there is listed::

    <!-- methods -->
    ...
    <!-- end methods -->

A fifth is a budget sweep's tables (:mod:`benchmarks.reporting.budget_curves`): each method's average accuracy,
diagonal and routing accuracy against epochs per experience, from the finished comparisons of the folder
``benchmarks/results/<name>/``, with the command that tables and plots them::

    <!-- budget: pacs_budget -->
    ...
    <!-- end budget -->

A fourth is the table of a method's options, written from its config's declarations (each option's
default and doc, :func:`avalanche_color.utils.checks.option`), then the keywords every strategy
takes besides; the block names the config, one of ``avalanche_color``'s names::

    <!-- options: CoLoRConfig -->
    ...
    <!-- end options -->
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from pathlib import Path

from benchmarks import REPOSITORY
from avalanche_color.runner.report import mean_and_spread, tuning_table
from benchmarks.reporting import by_label, markdown_table, summary_rows

README = REPOSITORY / "README.md"
DOCS = REPOSITORY / "docs"
RESULTS = REPOSITORY / "benchmarks" / "results"
CPU_THREADS = re.compile(r"^cpu\b.*?(\d+) threads?\b")
BLOCK = re.compile(r"(<!-- results: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end results -->)", re.DOTALL)
ACROSS = re.compile(r"(<!-- across: (?P<spec>[^|>]+)\|(?P<methods>[^>]+) -->\n)(?P<body>.*?)(<!-- end across -->)",
                    re.DOTALL)
METHODS_BLOCK = re.compile(r"(<!-- methods -->\n)(?P<body>.*?)(<!-- end methods -->)", re.DOTALL)
BUDGET_BLOCK = re.compile(r"(<!-- budget: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end budget -->)", re.DOTALL)
OPTIONS_BLOCK = re.compile(r"(<!-- options: (?P<config>\w+) -->\n)(?P<body>.*?)(<!-- end options -->)", re.DOTALL)
# A docstring's Sphinx role (:class:`~a.b.C`) and literal (``x``), as the docs pages show them: `C`, `x`.
SPHINX_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")
LITERAL = re.compile(r"``([^`]+)``")


def pages(repository: Path = REPOSITORY) -> list[Path]:
    """The pages that may hold results blocks: the README and every docs page."""
    return [repository / "README.md", *sorted((repository / "docs").rglob("*.md"))]


def render(name: str, results: Path = RESULTS) -> str:
    """The block for ``benchmarks/results/<name>``: command, table, machine."""
    result = json.loads((results / name / "results.json").read_text())
    command = _command(result)  # with its thread count: float sums depend on it
    # Wall time differs between runs and machines: it stays in summary.md, out of the pages.
    rows = [{column: value for column, value in row.items() if column != "minutes / run"}
            for row in summary_rows(result["runs"])]
    tuning = f"\n\n{tuning_table(result['tuning'])}" if "tuning" in result else ""
    return f"```bash\n{command}\n```\n\n{markdown_table(rows)}{tuning}\n\nMade on {result['device']}.\n"


def _command(result: dict) -> str:
    command = result["config"].get("command") or "python -m benchmarks.compare ..."
    threads = CPU_THREADS.search(result["device"])
    return f"OMP_NUM_THREADS={threads[1]} {command}" if threads else command


def parse_across(spec: str, methods: str) -> tuple[dict[str, list[str]], list[str]]:
    """``"pacs=a,b; tiny=c | M1 M2"`` as ({"pacs": ["a", "b"], "tiny": ["c"]}, ["M1", "M2"])."""
    columns = {}
    for part in spec.split(";"):
        benchmark, _, folders = part.strip().partition("=")
        columns[benchmark.strip()] = [folder.strip() for folder in folders.split(",") if folder.strip()]
    return columns, methods.split()


def render_across(columns: dict[str, list[str]], methods: list[str], results: Path = RESULTS) -> str:
    """Methods (rows) by benchmarks (columns): average accuracy, % (seeds), from the first folder of a
    benchmark that ran the method; then the commands of the folders that gave a cell."""
    loaded = {folder: json.loads((results / folder / "results.json").read_text())
              for folders in columns.values() for folder in folders}
    used: list[str] = []
    rows = []
    for method in methods:
        row = {"method": method}
        for benchmark, folders in columns.items():
            cell = "-"
            for folder in folders:
                group = by_label(loaded[folder]["runs"]).get(method)
                if group:
                    cell = f"{mean_and_spread([run['average_accuracy'] for run in group])} ({len(group)})"
                    used += [folder] if folder not in used else []
                    break
            row[benchmark] = cell
        rows.append(row)
    commands = "\n".join(_command(loaded[folder]) for folder in used)
    return f"{markdown_table(rows)}\n\n```bash\n{commands}\n```\n"


def render_budget(name: str, results: Path = RESULTS) -> str:
    """The block for the budget sweep in ``benchmarks/results/<name>/``: its finished points' tables of average
    accuracy, diagonal and routing accuracy against epochs, and the command that writes them with the plot."""
    from benchmarks.reporting.budget_curves import first_measured, metric_table, points

    try:
        found = first_measured([point for point in points(results / name) if point.finished])
    except FileNotFoundError:  # no comparison of the sweep has started
        found = []
    command = f"python -m benchmarks.reporting.budget_curves benchmarks/results/{name}"
    if not found:
        return f"```bash\n{command}\n```\n\nNo point of this sweep has finished yet.\n"
    tables = [f"{title}:\n\n{metric_table(found, metric)}" for metric, title in (
        ("final", "Average accuracy after the last experience (%)"),
        ("diagonal", "Diagonal, each experience's accuracy right after its own training (%)"),
        ("routing", "Routing accuracy (%)"))]
    return f"```bash\n{command}\n```\n\n" + "\n\n".join(tables) + "\n"


def render_methods() -> str:
    """The table of the runner's methods, one row per registered method, in registry order."""
    from avalanche_color.runner.methods import REGISTRY

    rows = []
    for name, entry in REGISTRY.items():
        takes = [flag for flag, taken in (("--rank", entry.lora), ("--k", entry.prototypes)) if taken]
        rows.append({"method": name, "strategy": f"`{entry.strategy}`" if entry.strategy else "Avalanche's",
                     "what it is": entry.about,
                     "seeds": "--seeds" if entry.frozen_backbone else "--baseline-seeds",
                     "takes": ", ".join(takes), "torchrun": "yes" if entry.distributed else "",
                     "lr": entry.lr_chosen_by or "nothing trains by gradient"})
    return f"{markdown_table(rows)}\n"


def render_options(config_name: str) -> str:
    """The table of a method's options, from its config (``avalanche_color.<config_name>``): each option in its
    declaration's order with its default and doc, then Avalanche's keywords that every strategy takes."""
    import avalanche_color
    from avalanche_color.training.strategy import STRATEGY_KEYWORDS, StrategyBase

    config_class = getattr(avalanche_color, config_name)
    keywords = inspect.signature(StrategyBase.__init__).parameters
    rows = [{"argument": f"`{spec.name}`", "default": _shown(spec.default), "meaning": _markdown(spec.metadata["doc"])}
            for spec in config_class.option_fields()]
    rows += [{"argument": f"`{name}`", "default": _shown(keywords[name].default), "meaning": _markdown(doc)}
             for name, doc in STRATEGY_KEYWORDS.items()]
    return f"{markdown_table(rows)}\n"


def _shown(default: object) -> str:
    if callable(default):
        return f"`{default.__name__}`"
    return repr(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else (
        f"`{json.dumps(default)}`" if isinstance(default, str) else f"`{default!r}`")


def _markdown(doc: str) -> str:
    """A docstring's text as a table cell shows it: roles and literals as code, ``|`` escaped."""
    doc = SPHINX_ROLE.sub(lambda m: f"``{m['target'].rsplit('.', 1)[-1] if m['tilde'] else m['target']}``", doc)
    return LITERAL.sub(r"`\1`", doc).replace("|", "\\|")


def block_names(text: str) -> list[str]:
    """The results folders ``text`` has blocks for, in order."""
    return [m["name"] for m in BLOCK.finditer(text)]


def across_names(text: str) -> list[str]:
    """The results folders ``text``'s across-benchmark blocks read."""
    return [folder for m in ACROSS.finditer(text) for folders in parse_across(m["spec"], m["methods"])[0].values()
            for folder in folders]


def updated(text: str, results: Path = RESULTS) -> str:
    """``text`` with every results block rewritten from its results file."""
    text = BLOCK.sub(lambda m: m.group(1) + render(m["name"], results) + m.group(4), text)
    text = METHODS_BLOCK.sub(lambda m: m.group(1) + render_methods() + m.group(3), text)
    text = OPTIONS_BLOCK.sub(lambda m: m.group(1) + render_options(m["config"]) + m.group(4), text)
    text = BUDGET_BLOCK.sub(lambda m: m.group(1) + render_budget(m["name"], results) + m.group(4), text)
    return ACROSS.sub(lambda m: m.group(1) + render_across(*parse_across(m["spec"], m["methods"]), results)
                      + m.group(5), text)


def stale_blocks(text: str, results: Path = RESULTS) -> list[str]:
    """Names of the blocks whose content differs from their results file (an across block: its spec)."""
    stale = [m["name"] for m in BLOCK.finditer(text) if m["body"] != render(m["name"], results)]
    stale += ["methods" for m in METHODS_BLOCK.finditer(text) if m["body"] != render_methods()]
    stale += [f"options: {m['config']}" for m in OPTIONS_BLOCK.finditer(text)
              if m["body"] != render_options(m["config"])]
    stale += [f"budget: {m['name']}" for m in BUDGET_BLOCK.finditer(text)
              if m["body"] != render_budget(m["name"], results)]
    return stale + [m["spec"].strip() for m in ACROSS.finditer(text)
                    if m["body"] != render_across(*parse_across(m["spec"], m["methods"]), results)]


def stale_pages(repository: Path = REPOSITORY, results: Path = RESULTS) -> dict[str, list[str]]:
    """For each page (relative to the repository) with stale blocks, their names."""
    stale = {str(page.relative_to(repository)): stale_blocks(page.read_text(), results)
             for page in pages(repository)}
    return {page: names for page, names in stale.items() if names}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        if stale:
            sys.exit(f"tables differ from their results: {stale}; run python -m benchmarks.reporting.readme")
        return
    for page in pages():
        text = page.read_text()
        fresh = updated(text)
        if fresh != text:
            page.write_text(fresh)
            print(f"rewrote {page.relative_to(REPOSITORY)}")


if __name__ == "__main__":
    main()
