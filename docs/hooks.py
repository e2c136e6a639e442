"""mkdocs hooks.

* The accuracy plots committed beside the results (``benchmarks/results/<name>/accuracy.png``) are published as
  ``results/<name>/accuracy.png``, so the benchmark pages show them without a copy.
* A word of code (``--loggers``, ``CoLoR-gaussian``, ``'.[test,benchmarks]'``, ``benchmarks.pretraining.<name>``)
  is kept on one line: browsers may break a line after a hyphen, a slash or before a bracket, even in code, and
  no CSS property turns that off, so each such word goes in a ``<span class="nobreak">`` that
  ``stylesheets/extra.css`` keeps whole. Lines of code still wrap at spaces (and in highlighted code between
  two tokens, e.g. before a bracket, never inside a name).
"""

import re
from pathlib import Path

from mkdocs.structure.files import File

CODE = re.compile(r"(<code\b[^>]*>)(.*?)(</code>)", re.S)
TAG = re.compile(r"(<[^>]+>)")
WORD = re.compile(r"[^\s<>]*[^\w\s<>][^\s<>]*")  # a word of code with a character a browser may break beside


def on_files(files, config):
    results = Path(config["docs_dir"]).parent / "benchmarks" / "results"
    for plot in sorted(results.glob("*/accuracy.png")):
        files.append(File.generated(config, f"results/{plot.parent.name}/accuracy.png", abs_src_path=str(plot)))
    return files


def keep_words_of_code_whole(html: str) -> str:
    """``html`` with every word (no space) inside a ``<code>`` element that holds a character other than a letter,
    digit or underscore wrapped in ``<span class="nobreak">`` (the text between tags only: the highlighter's
    tokens each stay as they are)."""

    def code(match: re.Match) -> str:
        parts = TAG.split(match[2])
        inner = "".join(part if part.startswith("<") else
                        WORD.sub(_nobreak, part) for part in parts)
        return match[1] + inner + match[3]

    return CODE.sub(code, html)


def _nobreak(word: re.Match) -> str:
    return word[0] if len(word[0]) == 1 else f'<span class="nobreak">{word[0]}</span>'


def on_page_content(html, page, config, files):
    return keep_words_of_code_whole(html)
