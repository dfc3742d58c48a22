"""The docs hold together as a reference (README.md and docs/*.md; no torch is imported).

- Every relative link resolves: to a file that exists, and an `#anchor` to a heading of that
  file under GitHub's slug rules; a section named in prose as `docs/X.md, "Heading"` exists.
- A measured-results table is a markdown table directly preceded by a line
  ``Command: `python -m benchmarks.X [flags]` `` (the command that reproduces it), or one whose
  cells hold measured quantities (MiB, GiB, ms, seconds, ratios): every such table has that
  line, the module `benchmarks.X` exists as a file, and its argparse options accept the flags
  (the parser is rebuilt from the module's `add_argument` calls, read with `ast`).
- Each doc holds at most one measured table, except docs/benchmarks.md, which holds the rest.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
BENCHMARKS = ROOT / "benchmarks"

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
NAMED_SECTION = re.compile(r"(?:docs/)?(\w+\.md)`?,? \"([^\"]+)\"")
COMMAND = re.compile(r"^Command: `python -m (benchmarks(?:\.\w+)*)((?: [^`]*)?)`$")
# a measured quantity in a cell: bytes in binary units, seconds, or a decimal ratio or percentage
MEASURED_CELL = re.compile(r"\d+\.\d+ ?(?:[KMG]iB|[KMG]B|ms|s|x|%)(?!\w)|\d+\.\d{2,}(?![\w.])")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markdown links and code marks dropped, lowercased,
    everything but letters, digits, `_`, `-` and spaces removed, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def outside_code(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of a markdown file, fenced code blocks left out."""
    kept, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append((number, line))
    return kept


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, repeated headings numbered `-1`, `-2` as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in outside_code(path):
        heading = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def plain(text: str) -> str:
    return text.replace("`", "")


def headings(path: Path) -> set[str]:
    return {m.group(1) for _, line in outside_code(path) if (m := re.match(r"^#+ +(.*)$", line))}


def test_slug_follows_githubs_rules():
    assert slug("Bytes: graph vs `saved_tensors_hooks`") == "bytes-graph-vs-saved_tensors_hooks"
    assert slug("Least + 10%") == "least--10"
    assert slug("The stage space with offload") == "the-stage-space-with-offload"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path):
    broken = []
    for number, line in outside_code(page):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue  # an absolute URL
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                broken.append(f"{page.name}:{number}: {target} (no such file)")
            elif anchor and anchor not in anchors(linked):
                broken.append(f"{page.name}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_section_named_in_prose_exists(page: Path):
    """`docs/offload.md, "Devices"` names a heading of docs/offload.md (its start suffices:
    a long heading may be named by its first words)."""
    text = re.sub(r"\s*\n\s*", " ", "\n".join(line for _, line in outside_code(page)))
    missing = []
    for name, section in NAMED_SECTION.findall(text):
        target = ROOT / "docs" / name
        if not target.exists():
            missing.append(f"{name} (no such doc)")
        elif not any(plain(h).startswith(plain(section)) for h in headings(target)):
            missing.append(f'{name}, "{section}"')
    assert not missing, f"{page.name} names sections that do not exist: {missing}"


@dataclass
class Table:
    page: Path
    line: int
    cells: str
    command: re.Match[str] | None


def tables(page: Path) -> list[Table]:
    """Every markdown table (a `|` row over a `|---|` row) with the `Command:` line directly
    above it, if that is the line above it (blank lines between allowed)."""
    lines = outside_code(page)
    found = []
    i = 0
    while i < len(lines) - 1:
        number, line = lines[i]
        if line.startswith("|") and re.match(r"^\|[\s:|-]+\|$", lines[i + 1][1]):
            j = i + 2
            while j < len(lines) and lines[j][1].startswith("|"):
                j += 1
            k = i - 1
            while k >= 0 and not lines[k][1].strip():
                k -= 1
            above = COMMAND.match(lines[k][1]) if k >= 0 else None
            body = "\n".join(row for _, row in lines[i + 2 : j])
            found.append(Table(page, number, body, above))
            i = j
        else:
            i += 1
    return found


def measured(table: Table) -> bool:
    """Preceded by a command, or two or more measured quantities in its cells (a reference
    table may give one example value, such as a default of 0.15)."""
    return table.command is not None or len(MEASURED_CELL.findall(table.cells)) >= 2


ALL_TABLES = [t for page in DOCS for t in tables(page)]


def test_every_measured_table_is_preceded_by_its_command():
    bare = [f"{t.page.name}:{t.line}" for t in ALL_TABLES if measured(t) and t.command is None]
    assert not bare, f"measured tables without a `Command: python -m benchmarks...` line: {bare}"


REFERENCE_DOCS = [p for p in DOCS if p.name != "benchmarks.md"]


@pytest.mark.parametrize("page", REFERENCE_DOCS, ids=lambda p: p.name)
def test_a_doc_holds_at_most_one_measured_table(page: Path):
    held = [t.line for t in tables(page) if measured(t)]
    assert len(held) <= 1, (
        f"{page.name} holds measured tables at lines {held}: keep one, move the others to "
        "docs/benchmarks.md with their commands"
    )


def module_files(module: str) -> list[Path]:
    """The source of `python -m module`: its file, or every file of its package."""
    path = ROOT.joinpath(*module.split("."))
    if path.with_suffix(".py").is_file():
        return [path.with_suffix(".py")]
    if (path / "__main__.py").is_file():
        return sorted(path.rglob("*.py"))
    return []


class RefusedArguments(Exception):
    pass


class StrictParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit; the test wants the message
        raise RefusedArguments(message)


def parser_of(files: list[Path]) -> StrictParser:
    """An argparse parser with every `add_argument` call of the files (and of
    `benchmarks.common.command_line` where a file calls it), its literal arguments kept:
    option names, `nargs`, `action`, literal `choices` (`type` and `required` are left out:
    values stay strings, and a shown command may give part of what a run needs)."""
    sources = list(files)
    if any("command_line(" in f.read_text() for f in files):
        sources.append(BENCHMARKS / "common.py")
    parser = StrictParser(add_help=False, conflict_handler="resolve")
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                continue
            names = [ast.literal_eval(arg) for arg in node.args]
            keywords = {}
            for keyword in node.keywords:
                if keyword.arg in ("nargs", "action", "dest"):
                    keywords[keyword.arg] = ast.literal_eval(keyword.value)
                elif keyword.arg == "choices":  # computed choices are not checked
                    with contextlib.suppress(ValueError):
                        keywords["choices"] = ast.literal_eval(keyword.value)
            parser.add_argument(*names, **keywords)
    return parser


COMMANDS = [t for t in ALL_TABLES if t.command is not None]


@pytest.mark.parametrize("table", COMMANDS, ids=lambda t: f"{t.page.name}:{t.line}")
def test_each_command_runs_a_benchmark_module_with_flags_it_accepts(table: Table):
    module, flags = table.command.group(1), table.command.group(2)
    files = module_files(module)
    assert files, f"{table.page.name}:{table.line}: no module {module} in benchmarks/"
    try:
        parser_of(files).parse_args(shlex.split(flags))
    except RefusedArguments as refused:
        pytest.fail(f"{table.page.name}:{table.line}: python -m {module}{flags}: {refused}")


def test_every_benchmark_parser_is_rebuilt_from_its_source():
    """The rebuilt parser reads every benchmark module with a command line (a call whose
    arguments are not literals would make the check above meaningless)."""
    for path in BENCHMARKS.rglob("*.py"):
        if "add_argument(" in path.read_text():
            parser_of([path])
