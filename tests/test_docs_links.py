"""The user documents hold together: every relative link (markdown links and images) in
README.md, data/README.md and docs/**/*.md points to a file that exists — and, for a
``#anchor`` into a Markdown file, to a heading that exists; no user document names a file a
user of the package does not have; and a newcomer's path (README → headline table → a
result page → its commands) ends at commands that name shipped recipes and make targets."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Links to pages that another branch adds; checked like any other link once the file exists.
#: Delete an entry when its page has been merged.
PENDING_PAGES: set[str] = set()  # pages linked before they are written (none now)

#: Names of files that only the project's own working notes have, and history words.
FORBIDDEN = ("PROTOCOLS.md", "PAPER-TABLES", "shared/seeds", "/work/", "this session")


def user_documents() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "data" / "README.md"]
    docs += sorted((ROOT / "docs").rglob("*.md"))
    return [d for d in docs if d.exists()]


# -- a small Markdown reader: what GitHub renders as links and headings ----------------------
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of [...] (a badge)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)))
    return out


def links(text: str) -> list[tuple[int, str]]:
    found = []
    for n, line in prose_lines(text):
        for pattern in (INLINE_LINK, HTML_LINK):
            found += [(n, m.group(1)) for m in pattern.finditer(line)]
        m = REF_DEF.match(line)
        if m:
            found.append((n, m.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, every character that is not
    a letter, digit, mark, connector, space or hyphen removed, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(ch for ch in text if ch in " -" or unicodedata.category(ch)[0] in "LNM"
                   or unicodedata.category(ch) == "Pc")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    text = path.read_text(encoding="utf-8")
    raw = text.splitlines()
    for n, line in prose_lines(text):
        if not HEADING.match(line):
            continue
        base = slug(HEADING.match(raw[n - 1]).group(2))  # a code span's text is in the anchor
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(doc: Path) -> list[str]:
    problems = []
    for line, target in links(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        where = f"{doc.relative_to(ROOT)}:{line}: {target}"
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        rel = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
        if not dest.exists():
            if rel not in PENDING_PAGES:
                problems.append(f"{where} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where} (no heading with anchor #{anchor} in {rel})")
    return problems


# -- the tests ---------------------------------------------------------------------------------
def test_the_markdown_reader_finds_links_and_anchors_as_github_does():
    text = ("See [a](b.md#c-d) and ![img](x/y.png \"t\"), `[not](code.md)`,\n"
            "[ref]: ../z.md\n```\n[in a fence](f.md)\n```\n<img src=\"p.png\">\n")
    assert [t for _, t in links(text)] == ["b.md#c-d", "x/y.png", "../z.md", "p.png"]
    assert slug("−GATES at lr 1.0") == "gates-at-lr-10"
    assert slug("Table 2, STAND-IN: SQuAD `dev` split") == "table-2-stand-in-squad-dev-split"
    assert slug("[Parser-v1](x.md)'s encoder lengths") == "parser-v1s-encoder-lengths"


def test_a_heading_with_a_code_span_keeps_its_text_in_the_anchor(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# The `dyck-report` sweep: m = 4\n```\n# not a heading\n```\n")
    assert anchors(page) == {"the-dyck-report-sweep-m--4"}


def test_a_broken_link_and_a_missing_anchor_are_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n## Two words\n", encoding="utf-8")
    doc = tmp_path / "docs" / "a.md"
    doc.write_text("[ok](b.md#two-words) [gone](c.md) [bad](b.md#three) [self](#nowhere)\n",
                   encoding="utf-8")
    problems = broken_links(doc)
    assert len(problems) == 3, problems
    assert "c.md (no such file)" in problems[0]
    assert "#three" in problems[1] and "#nowhere" in problems[2]


@pytest.mark.parametrize("doc", user_documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_and_heading_that_exist(doc):
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", user_documents() + sorted((ROOT / "recipes").rglob("*.yaml")),
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_user_document_names_files_a_user_does_not_have(doc):
    text = doc.read_text(encoding="utf-8")
    found = [f"line {text[:text.index(s)].count(chr(10)) + 1}: {s!r}" for s in FORBIDDEN if s in text]
    assert found == [], f"{doc.relative_to(ROOT)}: {found}"


def test_shipped_code_and_recipes_cite_papers_not_notes_files():
    """Docstrings, comments and recipe notes cite the papers and the original code by name."""
    shipped = [p for top in ("lstmablate", "tasks", "recipes", "experiments")
               for p in sorted((ROOT / top).rglob("*"))
               if p.suffix in (".py", ".yaml", ".c", ".h", ".md") and p.is_file()]
    assert len(shipped) > 50
    found = [f"{p.relative_to(ROOT)}: {s!r}" for p in shipped
             for s in FORBIDDEN[:3] if s in p.read_text(encoding="utf-8")]
    assert found == []


# -- the newcomer's path ---------------------------------------------------------------------
def headline_table_pages() -> list[Path]:
    """The result pages the README's first table links to."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_table = re.search(r"(?m)^\|.*\n\|[-| :]+\|\n(?:\|.*\n)+", text)
    assert first_table, "README.md has no table"
    targets = [t for _, t in links(first_table.group(0))]
    pages = [(ROOT / t.partition("#")[0]).resolve() for t in targets if t.startswith("docs/results/")]
    assert len(set(pages)) >= 4, f"the README's first table links to too few result pages: {targets}"
    return sorted(set(pages))


def shell_commands(page: Path) -> list[str]:
    """The commands of a page's ```bash blocks (comments dropped, continuations joined)."""
    commands = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                commands.append(line)
    return commands


def shipped_recipes() -> set[str]:
    out = subprocess.run([sys.executable, "-m", "lstmablate", "list", "recipes", "--plain"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return {line.split("\t")[0] for line in out.splitlines()[1:] if line.strip()}


def unshipped_recipes(args: list[str], recipes: set[str]) -> list[str]:
    """The recipe names in an ``lstmablate`` command's arguments that are not shipped."""
    named = [args[i + 1] for i, w in enumerate(args[:-1]) if w in ("--recipe", "--table")]
    if len(args) > 1 and args[0] == "sweep":
        named.append(args[1])
    return [n for n in named if not n.startswith("$") and n not in recipes]


def test_the_headline_table_leads_to_pages_whose_commands_name_shipped_recipes():
    recipes = shipped_recipes()
    make = shutil.which("make")
    for page in headline_table_pages():
        name = page.relative_to(ROOT).as_posix()
        assert page.exists(), name
        commands = shell_commands(page)
        assert any(c.startswith(("lstmablate ", "make ")) for c in commands), \
            f"{name}: no lstmablate or make command to reproduce its numbers"
        for cmd in commands:
            words = shlex.split(cmd)
            if words[0] == "lstmablate":
                unknown = unshipped_recipes(words[1:], recipes)
                assert unknown == [], f"{name}: `{cmd}` names recipes that are not shipped: {unknown}"
            elif words[0] == "make" and make:
                targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
                for target in targets:
                    r = subprocess.run([make, "-n", "-C", str(ROOT), target],
                                       capture_output=True, text=True)
                    assert r.returncode == 0, f"{name}: `{cmd}`: {r.stderr.strip()}"
                    # reproduce-% is a pattern rule: what it runs must name shipped recipes
                    for line in r.stdout.splitlines():
                        run = line.split()  # make's echo of a command, not for a shell
                        if "lstmablate" in run and "-m" in run:
                            unknown = unshipped_recipes(run[run.index("lstmablate") + 1:], recipes)
                            assert unknown == [], f"{name}: `{cmd}` runs `{line}`: {unknown}"
