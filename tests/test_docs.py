"""The README and the docs site: the site builds in strict mode, every Python block runs, every command exists.

Python blocks that cannot run offline carry a ``<!-- not run: why -->`` comment right before their
fence (tests/code_blocks.py); NOT_RUN below lists how many each page has, so none is skipped silently.
"""

from __future__ import annotations

import dataclasses
import html as entities
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_checklist import help_texts, missing_flags
from code_blocks import NOT_RUN, REPOSITORY, blocks, pages, run_page, runnable

README = REPOSITORY / "README.md"
DOCS = REPOSITORY / "docs"
# The Python blocks that do not run, per page: a download, or several processes.
NOT_RUN_BLOCKS = {"docs/guide/index.md": 1, "docs/guide/torchrun.md": 1}
README_MAX_LINES = 300

COMMAND = re.compile(r"(?:^|[\s;&|(])(?:\S*python3?|torchrun)\b(?P<options>[^\n#]*?)\s-m\s+(?P<module>[\w.]+)(?P<rest>[^\n#]*)")
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+(?P<words>[^\n#`]*)")
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, env=environment, capture_output=True,
                          text=True, timeout=300)


def test_the_site_builds_in_strict_mode(tmp_path):
    # One build for every check of the built site (a second would add its 20 s to the suite).
    site = tmp_path / "site"
    run = build_site(REPOSITORY / "mkdocs.yml", site)
    assert run.returncode == 0, run.stderr[-4000:]
    api = (site / "api" / "index.html").read_text()
    assert "CoLoRConfig" in api and "routing_accuracy_metrics" in api  # mkdocstrings rendered the package
    assert (site / "results" / "pacs" / "accuracy.png").exists()  # the hook published the plots
    assert "load_digits" in (site / "index.html").read_text()  # the README's quick start, included
    for page in pages()[1:]:  # every docs page is in the site
        relative = page.relative_to(DOCS).with_suffix("")
        folder = relative.parent if relative.name == "index" else relative
        assert (site / folder / "index.html").exists(), page
    # As a browser shows it: tables are tables, no reST "::" shows, code wraps instead of running off the page.
    for html in sorted(site.rglob("*.html")):
        text = html.read_text()
        assert not raw_table_rows(text), (html, raw_table_rows(text)[:3])
        assert not STRAY_LITERAL_MARKER.search(text), (html, STRAY_LITERAL_MARKER.search(text))
    css = (site / "stylesheets" / "extra.css").read_text()
    assert "stylesheets/extra.css" in (site / "index.html").read_text()
    assert_code_wraps_at_spaces_only(css)
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    assert '</span><span class="nobreak">--loggers</span>' in benchmarks  # the hook kept the flag whole
    assert not re.search(r"[^>]--loggers", benchmarks)
    assert_the_site_reads_right_offline(site)


def assert_code_wraps_at_spaces_only(css: str) -> None:
    """The rules of docs/stylesheets/extra.css that keep every word of code whole: lines of code wrap at spaces
    (not scrolling sideways), Material's break-word is undone, and a span.nobreak (docs/hooks.py) never breaks."""
    rules = {selector.strip(): body for selector, body in
             re.findall(r"([^{}]+)\{([^}]*)\}", re.sub(r"/\*.*?\*/", "", css, flags=re.S))}
    assert "white-space: pre-wrap" in rules[".md-typeset pre > code"]
    # A wrapped line keeps its indentation (a hanging indent from span.line's --indent, docs/hooks.py) and is
    # an inline-block (a block would add a newline to what the copy button copies); the first line leaves
    # room for the copy button.
    line = rules[".md-typeset pre > code .line"]
    assert "display: inline-block" in line
    assert re.search(r"padding-left: calc\(\(var\(--indent, 0\) \+ (\d+)\) \* 1ch\)", line)
    assert re.search(r"text-indent: calc\(\(var\(--indent, 0\) \+ (\d+)\) \* -1ch\)", line)
    assert (re.search(r"padding-left: calc\(\(var\(--indent, 0\) \+ (\d+)\)", line)[1]
            == re.search(r"text-indent: calc\(\(var\(--indent, 0\) \+ (\d+)\)", line)[1])
    assert re.search(r"margin-right: [1-9][\d.]*em", rules[".md-typeset pre > code > .line:first-child"])
    assert re.search(r"word-break: normal;\s*overflow-wrap: normal", rules[".md-typeset code"])
    assert "white-space: nowrap" in rules[".md-typeset code .nobreak"]
    assert not re.search(r"anywhere|break-word|break-all", "".join(rules.values()))


# A script or stylesheet the page loads from another host: <script src="http..."> or <link href="http...">
# (a <link rel="preconnect"> to a font host is one too).
REMOTE_ASSET = re.compile(r"""<(?:script|link)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//[^"'\s>]+""")
MATH_LIBRARY = re.compile(r"katex|mathjax", re.I)


def assert_the_site_reads_right_offline(site: Path) -> None:
    """Nothing loads from another host (no CDN script or stylesheet for math, no web font), every formula is
    MathML (rendered by the browser itself), and code blocks are laid out line by line, their text intact."""
    for html in sorted(site.rglob("*.html")):
        text = html.read_text()
        assert REMOTE_ASSET.findall(text) == [], html
        assert not MATH_LIBRARY.search(" ".join(re.findall(r"<(?:script|link)\b[^>]*>", text))), html
        # Every formula arithmatex marked became MathML: none is left as TeX for a script to typeset.
        assert not re.search(r'<(span|div) class="arithmatex">', text), html
    fidelity = (site / "fidelity" / "index.html").read_text()
    formulas = re.findall(r'<math xmlns="http://www.w3.org/1998/Math/MathML" display="(block|inline)" '
                          r'class="arithmatex"><semantics><mrow>(.*?)</mrow><annotation encoding="application/x-tex">'
                          r'(.*?)</annotation></semantics></math>', fidelity, flags=re.S)
    assert len(formulas) >= 10 and {display for display, _, _ in formulas} == {"block", "inline"}
    assert all("<mi>" in body and "\\" not in body for _, body, _ in formulas)  # symbols, no TeX command as text
    assert "\\lVert B \\rVert_F \\, \\lVert A \\rVert_F" in {tex for _, _, tex in formulas}
    assert "‖" not in fidelity and not re.search(r"<code>[^<]*sum_\{", fidelity)  # no formula left as code
    assert "<math " in (site / "guide" / "lora-peers" / "index.html").read_text()
    # Code blocks: every line of a highlighted block is a span.line with its indentation, and the copied text
    # (the code's text without tags) is the Markdown's code as written.
    avalanche = (site / "guide" / "avalanche" / "index.html").read_text()
    assert '<span class="line" style="--indent: 4">' in avalanche
    source = (DOCS / "guide" / "avalanche.md").read_text()
    blocks_in_page = [entities.unescape(HTML_TAG.sub("", code)) for code in
                      re.findall(r"<pre><span></span><code>(.*?)</code></pre>", avalanche, flags=re.S)]
    assert blocks_in_page and all(code.strip() in source for code in blocks_in_page)


def test_the_hook_writes_formulas_as_mathml_and_refuses_tex_it_cannot_convert():
    hooks = load_hooks()
    inline = hooks.formulas_as_mathml('<p>so <span class="arithmatex">\\(x &lt; \\lVert y \\rVert_F\\)</span>.</p>')
    assert inline.startswith('<p>so <math xmlns="http://www.w3.org/1998/Math/MathML" display="inline"')
    assert "<mi>x</mi><mo>&#x0003C;</mo><mo>&#x02016;</mo><mi>y</mi>" in inline and inline.endswith("</math>.</p>")
    assert '<annotation encoding="application/x-tex">x &lt; \\lVert y \\rVert_F</annotation>' in inline
    shown = hooks.formulas_as_mathml('<div class="arithmatex">\\[\n\\sum_{i&lt;t} a_i\n\\]</div>')
    assert 'display="block"' in shown and "<munder><mo>&#x02211;</mo>" in shown
    for tex, says in [("a^", "MissingSuperScriptOrSubscriptError"), ("\\lVertt x", "uses \\lVertt")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            hooks.formulas_as_mathml(f'<span class="arithmatex">\\({tex}\\)</span>')


def test_the_hook_puts_each_line_of_code_in_a_span_with_its_indentation_and_keeps_the_text():
    hooks = load_hooks()
    code = ('<span class="k">def</span> <span class="nf">f</span>():\n'
            '    <span class="s">"""two\n      lines"""</span>\n\n        x &lt; y\n')
    block = f'<div class="highlight"><pre><span></span><code>{code}</code></pre></div>'
    lines = hooks.lines_of_code_blocks(block)
    assert re.findall(r'--indent: (\d+)', lines) == ["0", "4", "6", "8"]
    assert lines.count('<span class="line"') == 4 and "\n\n" in lines  # the empty line stays a bare newline
    # The string token spread over two lines is closed and reopened: each line's tags balance.
    assert '<span class="line" style="--indent: 6"><span class="s">      lines"""</span></span>' in lines
    for line in re.findall(r'<span class="line"[^>]*>.*', lines):
        assert line.count("<span") == line.count("</span>"), line
    assert HTML_TAG.sub("", lines) == HTML_TAG.sub("", block)  # the text, hence what is copied, is unchanged
    assert hooks.lines_of_code_blocks("<p><code>x\ny</code></p>") == "<p><code>x\ny</code></p>"  # inline code


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_the_hook_keeps_each_word_of_code_whole_and_leaves_tags_and_prose_alone():
    hooks = load_hooks()
    page = ('<p>a well-known <code>--k 10 --loggers</code></p>'
            '<pre><code><span class="n">x</span> --seeds 0 1 CoLoR-gaussian &lt;a.b&gt; a - b routing_features</code></pre>')
    assert hooks.keep_words_of_code_whole(page) == (
        '<p>a well-known <code><span class="nobreak">--k</span> 10 <span class="nobreak">--loggers</span></code></p>'
        '<pre><code><span class="n">x</span> <span class="nobreak">--seeds</span> 0 1 '
        '<span class="nobreak">CoLoR-gaussian</span> <span class="nobreak">&lt;a.b&gt;</span> a - b routing_features'
        '</code></pre>')


# The text outside code blocks of a rendered page, line by line; a line of it that starts and ends with a pipe is a
# Markdown table row the page shows as raw text (e.g. a table inside a list item without a blank line before it).
HTML_CODE = re.compile(r"<(pre|script|style|textarea)\b.*?</\1>", re.S)
HTML_TAG = re.compile(r"<[^>]+>")
TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
STRAY_LITERAL_MARKER = re.compile(r"::</p>")  # a docstring's reST "::" before a code block, shown as text


def raw_table_rows(html: str) -> list[str]:
    import html as entities

    text = entities.unescape(HTML_TAG.sub("", HTML_CODE.sub("", html)))
    return [line.strip() for line in text.splitlines() if TABLE_ROW.match(line)]


def test_the_raw_table_check_finds_a_table_that_did_not_render():
    shown = "<p>Refused:\n  | <code>ReplayPlugin</code> | replays | <em>why</em> |\n  |---|---|---|</p>"
    assert raw_table_rows(shown) == ["| ReplayPlugin | replays | why |", "|---|---|---|"]
    rendered = "<table><tr><td>a</td><td>b</td></tr></table><pre><code>x = a | b |\n| c |</code></pre>"
    assert raw_table_rows(rendered) == []


@pytest.mark.parametrize("broken, says", [
    ("[a page](no-such-page.md)", "no-such-page.md"),
    ("[a section](guide/options.md#no-such-section)", "no-such-section"),
    ("::: avalanche_color.NoSuchStrategy", "NoSuchStrategy"),
])
def test_a_broken_link_or_a_stale_api_name_fails_the_build(tmp_path, broken, says):
    run = build_small_site(tmp_path, broken)
    assert run.returncode != 0 and says in run.stdout + run.stderr, run.stderr[-4000:]


def test_the_broken_line_checks_small_site_builds_with_a_sound_line(tmp_path):
    # So the checks above fail for their broken line, not for the small site.
    run = build_small_site(tmp_path, "[a section](guide/options.md#a-section)")
    assert run.returncode == 0, run.stderr[-4000:]


def build_small_site(tmp_path: Path, line: str) -> subprocess.CompletedProcess:
    """The site's own configuration (its validation, hooks and plugins) over two small pages, ``line`` in the
    home page: the checks are the configuration's, and the whole site's build costs the suite 15 s a case."""
    import yaml

    project = tmp_path / "project"
    (project / "docs" / "guide").mkdir(parents=True)
    config = yaml.safe_load((REPOSITORY / "mkdocs.yml").read_text())
    config["nav"] = [{"Home": "index.md"}, {"Options": "guide/options.md"}]
    (project / "mkdocs.yml").write_text(yaml.safe_dump(config))
    for name in ("hooks.py", "derived_docs.py", "sphinx_roles.py", "stylesheets"):
        (project / "docs" / name).symlink_to(DOCS / name)
    (project / "docs" / "guide" / "options.md").write_text("# Options\n\n## A section\n\nBack [home](../index.md).\n")
    for name in ("avalanche_color", "benchmarks"):
        (project / name).symlink_to(REPOSITORY / name)
    (project / "docs" / "index.md").write_text(f"# Home\n\nSee [the options](guide/options.md).\n\n{line}\n")
    return build_site(project / "mkdocs.yml", tmp_path / "site")


def test_every_public_name_has_an_entry_in_the_api_reference():
    import avalanche_color

    public = set(avalanche_color.__all__)
    documented = set(re.findall(r"^::: avalanche_color\.(\w+)$", (DOCS / "api.md").read_text(), flags=re.MULTILINE))
    assert public - documented == set(), "add them to docs/api.md"


def option_table_names() -> set[str]:
    text = (DOCS / "guide" / "options.md").read_text()
    names: set[str] = set()
    for row in re.findall(r"^\| (`[^|]*`) \|", text, flags=re.MULTILINE):
        names.update(re.findall(r"`(\w+)`", row))
    return names


def test_the_option_table_describes_every_option_and_no_other():
    from avalanche_color import CoLoRConfig

    avalanche_keywords = {"criterion", "device", "plugins", "evaluator"}
    options = {field.name for field in dataclasses.fields(CoLoRConfig) if field.init}
    assert option_table_names() - avalanche_keywords == options, "docs/guide/options.md"


def test_the_readme_fits_and_its_links_lead_somewhere():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10  # the README points into the docs
    assert [link for link in local if not (REPOSITORY / link).exists()] == []


def test_no_page_names_a_folder_of_the_machine_it_was_written_on():
    for page in pages():
        assert not re.search(r"/(work|home|Users|tmp)/\w", page.read_text()), page


# ---------------------------------------------------------------------- code blocks


def test_every_python_block_runs_or_says_why_not():
    counted = {}
    for page in pages():
        text = page.read_text()
        found = blocks(page)
        skipped = [block for block in found if block.not_run is not None]
        # A marker that is not right before a Python block would skip nothing, or a block of another language.
        assert len(NOT_RUN.findall(text)) == len(skipped), f"{page}: a not-run marker without a Python block after it"
        assert all(block.language == "python" and block.not_run.strip() for block in skipped), page
        if skipped:
            counted[str(page.relative_to(REPOSITORY))] = len(skipped)
    assert counted == NOT_RUN_BLOCKS
    assert sum(len(runnable(page)) for page in pages()) >= 10


# Pages whose blocks a test of their own runs, and checks what they print: run once, there.
RUN_BY_THEIR_OWN_TEST = {
    "README.md": ("test_quick_start.py", "test_quick_start_runs_as_printed_offline_learns_and_warns_of_nothing"),
    "docs/guide/trained-model.md": ("test_readme_usage.py", "test_using_a_trained_model_runs_as_printed"),
}


@pytest.mark.slow
@pytest.mark.parametrize("page", [page.relative_to(REPOSITORY) for page in pages()
                                  if runnable(page) and str(page.relative_to(REPOSITORY)) not in RUN_BY_THEIR_OWN_TEST],
                         ids=str)
def test_a_pages_python_blocks_run_in_order(page):
    run = run_page(REPOSITORY / page)
    assert run.returncode == 0, run.stderr[-4000:]


def test_the_pages_left_to_their_own_tests_are_run_there():
    for page, (module, test) in RUN_BY_THEIR_OWN_TEST.items():
        assert runnable(REPOSITORY / page), page
        assert f"def {test}" in (REPOSITORY / "tests" / module).read_text(), (page, module, test)


def shell_commands() -> list[tuple[str, str]]:
    """(page, command) for every line of a shell block and every inline command of the README and docs."""
    found = []
    for page in pages():
        name = str(page.relative_to(REPOSITORY))
        for block in blocks(page):
            if block.language in ("bash", "sh", "shell", "console"):
                found += [(name, line) for line in block.code.replace("\\\n", " ").splitlines() if line.strip()]
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        spans = [" ".join(span.split()) for span in INLINE.findall(prose)]
        found += [(name, span) for span in spans if re.search(r"\bpython3? |\bmake ", span)]
    return found


def modules_and_flags() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for _, command in shell_commands():
        for match in COMMAND.finditer(command):
            used.setdefault(match["module"], set()).update(re.findall(r"(?<!\S)(--[a-z][\w-]*)", match["rest"]))
    # The runner's page names its flags on their own too (`--resume`, `--workers N`).
    prose = re.sub(r"```.*?```", "", (DOCS / "benchmarks" / "runner.md").read_text(), flags=re.DOTALL)
    used["benchmarks.compare"].update(re.findall(r"(?<![`\w])`(--[a-z][\w-]*)", prose))
    return used


def test_every_module_a_page_runs_exists():
    used = modules_and_flags()
    assert {"benchmarks.compare", "benchmarks.reporting.reproduce", "benchmarks.reporting.readme"} <= set(used)
    sys.path.insert(0, str(REPOSITORY))
    try:
        missing = [module for module in used if module != "mkdocs" and importlib.util.find_spec(module) is None]
    finally:
        sys.path.remove(str(REPOSITORY))
    assert missing == []


def test_every_make_target_a_page_names_exists():
    makefile = (REPOSITORY / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+(?:%[\w.-]*)?)\s*:(?!=)", makefile, flags=re.MULTILINE))
    named = set()
    for _, command in shell_commands():
        for match in MAKE.finditer(command):
            named.update(word for word in match["words"].split() if not word.startswith("-") and "=" not in word)
    assert {"main", "test", "benchmarks"} <= named
    assert sorted(named - targets) == []


@pytest.mark.slow
def test_every_flag_a_page_gives_a_command_is_one_of_its_flags():
    used = {module: flags for module, flags in modules_and_flags().items() if flags and module != "mkdocs"}
    assert "--benchmark" in used["benchmarks.compare"]
    helps, run = help_texts(used, env={"OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    assert set(helps) == set(used)
    assert missing_flags(used, helps) == {}
