"""The result tables of the README and the docs pages, written from the committed results files, never by hand.

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
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from benchmarks import REPOSITORY
from benchmarks.reporting import markdown_table, summary_rows

README = REPOSITORY / "README.md"
DOCS = REPOSITORY / "docs"
RESULTS = REPOSITORY / "benchmarks" / "results"
CPU_THREADS = re.compile(r"^cpu\b.*?(\d+) threads?\b")
BLOCK = re.compile(r"(<!-- results: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end results -->)", re.DOTALL)


def pages(repository: Path = REPOSITORY) -> list[Path]:
    """The pages that may hold results blocks: the README and every docs page."""
    return [repository / "README.md", *sorted((repository / "docs").rglob("*.md"))]


def render(name: str, results: Path = RESULTS) -> str:
    """The block for ``benchmarks/results/<name>``: command, table, machine."""
    result = json.loads((results / name / "results.json").read_text())
    command = result["config"].get("command") or "python -m benchmarks.compare ..."
    threads = CPU_THREADS.search(result["device"])
    if threads:  # float sums depend on the thread count: the same count gives the same table
        command = f"OMP_NUM_THREADS={threads[1]} {command}"
    # Wall time differs between runs and machines: it stays in summary.md, out of the pages.
    rows = [{column: value for column, value in row.items() if column != "minutes / run"}
            for row in summary_rows(result["runs"])]
    return f"```bash\n{command}\n```\n\n{markdown_table(rows)}\n\nMade on {result['device']}.\n"


def block_names(text: str) -> list[str]:
    """The results folders ``text`` has blocks for, in order."""
    return [m["name"] for m in BLOCK.finditer(text)]


def updated(text: str, results: Path = RESULTS) -> str:
    """``text`` with every results block rewritten from its results file."""
    return BLOCK.sub(lambda m: m.group(1) + render(m["name"], results) + m.group(4), text)


def stale_blocks(text: str, results: Path = RESULTS) -> list[str]:
    """Names of the blocks whose content differs from their results file."""
    return [m["name"] for m in BLOCK.finditer(text) if m["body"] != render(m["name"], results)]


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
