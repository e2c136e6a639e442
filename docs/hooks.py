"""mkdocs hooks.

* The accuracy plots committed beside the results (``benchmarks/results/<name>/accuracy.png``) are published as
  ``results/<name>/accuracy.png``, so the benchmark pages show them without a copy; so are the budget sweeps'
  plots (``benchmarks/results/<name>_budget/budget.png``).
* A word of code (``--loggers``, ``CoLoR-gaussian``, ``'.[test,benchmarks]'``, ``benchmarks.pretraining.<name>``)
  is kept on one line: browsers may break a line after a hyphen, a slash or before a bracket, even in code, and
  no CSS property turns that off, so each such word goes in a ``<span class="nobreak">`` that
  ``stylesheets/extra.css`` keeps whole. Lines of code still wrap at spaces (and in highlighted code between
  two tokens, e.g. before a bracket, never inside a name).
* A line of a code block that wraps keeps its indentation: each line goes in a ``<span class="line"
  style="--indent: N">`` (N: its leading spaces), which ``stylesheets/extra.css`` lays out with a hanging
  indent, so a wrapped part starts four columns right of where its line starts, never at column 0. The
  newlines stay outside the spans, so the copy button copies the code as written.
* Formulas are MathML, written at build time: pymdownx.arithmatex (generic) marks them ``\\( \\)`` and
  ``\\[ \\]``, and ``latex2mathml`` turns each into a ``<math>`` element that browsers render natively, with
  no script and no network (the TeX is kept as the formula's annotation). A formula it cannot convert
  fails the build, naming the page.
"""

import html as entities
import re
from pathlib import Path

from mkdocs.structure.files import File

CODE = re.compile(r"(<code\b[^>]*>)(.*?)(</code>)", re.S)
TAG = re.compile(r"(<[^>]+>)")
WORD = re.compile(r"[^\s<>]*[^\w\s<>][^\s<>]*")  # a word of code with a character a browser may break beside
# A code block's code, as pymdownx.highlight (and mkdocstrings' signatures) write it: <pre><span></span><code>.
BLOCK = re.compile(r"(<pre\b[^>]*>(?:<span></span>)?<code\b[^>]*>)(.*?)(</code></pre>)", re.S)
OPENING = re.compile(r"<(\w+)\b[^>]*>")
# pymdownx.arithmatex's generic output: \( \) in a span (inline), \[ \] in a div (displayed).
FORMULA = re.compile(r'<(span|div) class="arithmatex">\s*\\([(\[])(.*?)\\[)\]]\s*</\1>', re.S)
UNKNOWN_COMMAND = re.compile(r">(\\[A-Za-z]+)")


def on_files(files, config):
    results = Path(config["docs_dir"]).parent / "benchmarks" / "results"
    for plot in sorted([*results.glob("*/accuracy.png"), *results.glob("*/budget.png")]):
        files.append(File.generated(config, f"results/{plot.parent.name}/{plot.name}", abs_src_path=str(plot)))
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


def lines_of_code_blocks(html: str) -> str:
    """``html`` with every non-empty line of every code block in ``<span class="line" style="--indent: N">``,
    N its leading spaces; a token the highlighter spread over lines is closed at each line's end and
    reopened at the next one's start, so every line's span holds balanced tags."""

    def block(match: re.Match) -> str:
        lines, line, open_tags = [], [], []
        for part in TAG.split(match[2]):
            if part.startswith("</"):
                open_tags.pop()
                line.append(part)
            elif part.startswith("<"):
                if not part.endswith("/>"):
                    open_tags.append(part)
                line.append(part)
            else:
                first, *rest = part.split("\n")
                line.append(first)
                for text in rest:
                    lines.append(line + ["</" + OPENING.match(tag)[1] + ">" for tag in reversed(open_tags)])
                    line = [*open_tags, text]
        lines.append(line)
        return match[1] + "\n".join(_line(parts) for parts in lines) + match[3]

    return BLOCK.sub(block, html)


def _line(parts: list[str]) -> str:
    text = entities.unescape("".join(part for part in parts if not part.startswith("<")))
    if not text:
        return "".join(parts)  # an empty line (or the block's last newline) adds no box
    indent = len(text) - len(text.lstrip(" "))
    return f'<span class="line" style="--indent: {indent}">{"".join(parts)}</span>'


def formulas_as_mathml(html: str) -> str:
    """``html`` with each formula pymdownx.arithmatex marked as MathML; ``ValueError`` names one that
    latex2mathml cannot convert."""
    from latex2mathml.converter import convert

    def formula(match: re.Match) -> str:
        tex = entities.unescape(match[3]).strip()
        display = "block" if match[2] == "[" else "inline"
        try:
            mathml = convert(tex, display=display)
        except Exception as error:  # latex2mathml raises its own exception classes, and others on odd input
            raise ValueError(f"formula {tex!r} is not TeX that latex2mathml converts "
                             f"({type(error).__name__}: {error})") from error
        unknown = UNKNOWN_COMMAND.search(mathml)  # latex2mathml writes a command it does not know as text
        if unknown:
            raise ValueError(f"formula {tex!r} uses {unknown[1]}, a command latex2mathml does not know")
        opening, _, rest = mathml.partition(">")
        body = rest.removesuffix("</math>")
        annotation = f'<annotation encoding="application/x-tex">{entities.escape(tex, quote=False)}</annotation>'
        # <semantics> shows its first child only: the formula, in one <mrow>.
        return f'{opening} class="arithmatex"><semantics><mrow>{body}</mrow>{annotation}</semantics></math>'

    return FORMULA.sub(formula, html)


def on_page_content(html, page, config, files):
    try:
        html = formulas_as_mathml(html)
    except ValueError as error:
        raise ValueError(f"{page.file.src_uri}: {error}") from error
    return lines_of_code_blocks(keep_words_of_code_whole(html))
