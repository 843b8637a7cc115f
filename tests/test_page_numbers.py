"""The numbers a results page writes by hand are backed by its records or by the paper.

A results page (``docs/results/*.md``) is generated tables (``<!-- generated: COMMAND -->`` ...
``<!-- /generated -->``, rewritten from the run records by ``tools/pages.py``) and prose
written by hand.  ``tests/test_pages.py`` keeps the tables equal to the records; this test
keeps the prose from saying a number that nothing backs.  Every number it checks, in the
prose OUTSIDE generated blocks, must be one of:

1. a number of the page's own generated blocks, written the same way (``36.48`` backs
   ``36.48``, not ``36.5``: a block's numbers are already rounded);
2. a value of the page's run records (:data:`PAGES`: record folders or files under
   ``experiments/results/`` or ``benchmarks/results/``): every number of each run's
   ``result.json``, ``metrics.jsonl``, ``config.yaml`` and ``env.json`` and of any other JSON
   file listed (the per-item ``scores/`` are not records of a number a page quotes);
3. a value of the page's recipes (``recipes/NAME.yaml``): the paper's tables in their
   ``reference:`` blocks and ``reference_source`` texts, and their settings (the protocol the
   page describes, e.g. ``ptb-large``'s dropout 0.65, which no run has recorded yet);
4. a number the page marks as derived, in an HTML comment on lines of its own (before the
   paragraph that uses it: a comment inside a paragraph would split it)::

       <!-- derived: 1.7 = 38.19 - 36.48 -->

   (several ``NUMBER = EXPRESSION`` separated by ``;`` in one comment).  The expression is
   parsed with :mod:`ast` and only numbers, ``+ - * /``, unary minus and parentheses are
   accepted (nothing is ever evaluated as code); its value, written with the number's
   decimals, must be the number (a bare operand is a rounding: ``2.7 = 2.71``); every decimal
   operand must itself come from sources 1-3, every integer operand from a record's or
   recipe's values (exactly), a generated block, or the unit changes of :data:`UNITS`
   (``822.8 = 822752126 / 1000000``).  A marker whose number the prose no longer shows fails
   too (it would back nothing).

A value of 2 or 3 backs a prose number when it equals it (``0.5`` backs ``0.5`` and
``0.50``) or, if the number shows at least :data:`MIN_ROUNDED_DIGITS` significant digits,
when it rounds to it at the number's decimals (``63.064`` backs ``63.1`` and ``63.06``).
Fewer digits are not matched by rounding: the records of one page hold hundreds of values
that round to any one-decimal number, so ``1.7`` (a difference of two BLEU scores) would
always pass.  The limits that remain: a number of one or two significant digits that equals
a setting or a block's number by chance passes (a gap of ``0.3`` and a dropout of 0.3), and
so does a three-digit number where the records are dense (a page's hundreds of training
losses near 3.5 hold most of 3.40-3.99).  The test proves that a number has a source, not
that it has the right one: mark differences derived all the same, so that a reader sees
where they come from.

Which numbers are checked: decimal numbers (``36.48``, ``0.3``, ``1.7``, ``2.7 %``,
``822.8M``), signs ignored (a prose ``−1.2`` is the magnitude ``1.2``).  Not checked:

* integers (``13 epochs``, ``seed 3``, ``2 cores``, ``Table 4``, ``5,902 steps``, years and
  dates): in prose they are overwhelmingly counts, sizes, names and dates, which no record
  spells the same way; a measured value should be written with its decimals;
* version numbers: a number with a second dot (``2.13.0``), one glued to a letter before it
  (``v1.1``, ``x86_64``) or following a word of :data:`VERSION_WORDS` (``UD 2.16``,
  ``PyTorch 2.13``); numbers in exponent form (``4.4e8``);
* section numbers after ``§`` (``§6.2``);
* anything in code: fenced code blocks, inline code spans (commands, options such as
  ``--set train.lr=0.2``, commit hashes), link targets, URLs and HTML comments (but the
  derived markers).

A page is checked against the sources :data:`PAGES` names for it; add a page there with the
records and recipes its prose speaks of.  A failure names the page, the line and the number;
fix the prose (correct the number, let a generated block show it, or mark it derived with
its expression) — never the list of sources, unless the page does speak of that record.
The records are read once per page (the index page, which speaks of every record, takes
about three seconds; the others well under one).
"""

from __future__ import annotations

import ast
import glob
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from lstmablate.io import load_yaml, parse_json, read_json, read_lines, read_text
from lstmablate.runfolder import RunNames

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


@dataclass(frozen=True)
class Sources:
    """What a page's prose may quote: record folders or files (globs relative to the
    repository root) and the recipes (name globs under ``recipes/``) whose settings and
    reference numbers it speaks of."""

    records: tuple[str, ...]
    recipes: tuple[str, ...]


#: the pages checked, and the records and recipes each speaks of (the index page speaks of
#: every record and recipe)
PAGES: dict[str, Sources] = {
    "README.md": Sources(records=("experiments/results/*",), recipes=("*",)),
    "table1-ptb.md": Sources(
        records=("experiments/results/ptb-medium", "experiments/results/ptb-small",
                 "experiments/results/ptb-small-gates-lr0.*", "experiments/results/gates*",
                 "experiments/results/bwb_step_time.json"),
        recipes=("ptb-small", "ptb-medium", "ptb-large", "bwb-lstm-2048-512")),
    "table2-squad.md": Sources(
        records=("experiments/results/squad-*-standin-dev-split",),
        recipes=("squad-drqa*", "squad-bidaf*")),
    "table4-nmt.md": Sources(
        records=("experiments/results/nmt-multi30k", "experiments/results/nmt-multi30k-cpu",
                 "benchmarks/results/gpu-check-nvidia-h200-20261128-215229.json"),
        recipes=("nmt-multi30k*",)),
    "secondorder-table2.md": Sources(
        records=("experiments/results/secondorder-char-*", "experiments/results/secondorder-word-*"),
        recipes=("secondorder-*",)),
    "secondorder-table3.md": Sources(
        records=("experiments/results/secondorder-cut*",), recipes=("secondorder-*",)),
}

#: words after which a number is a version, not a measurement
VERSION_WORDS = ("UD", "EWT", "Python", "PyTorch", "CUDA", "Triton", "version", "release")
#: a record's value rounded to a prose number's decimals backs it only when the number shows at
#: least this many significant digits: with fewer, hundreds of values round to it
MIN_ROUNDED_DIGITS = 3
#: the integer operands a derived expression may use without a source: unit changes
UNITS = (60, 100, 1000, 1_000_000, 1_000_000_000)

#: a decimal number: not glued to a word, a dot or a comma before it, not followed by a digit,
#: an underscore, a second dotted part (a version such as 2.13.0) or an exponent (4.4e8); a
#: unit may follow it (822.8M, 2.5x)
NUMBER = re.compile(r"(?<![\w.,§])(\d+\.\d+)(?![\d_]|\.\d|[eE][+-]?\d)")
#: an integer, with or without thousands separators (a generated block's, for derived operands)
INTEGER = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?![\w]|[.,]\d)")
VERSION = re.compile(r"\b(?:" + "|".join(VERSION_WORDS) + r")\s+$")
DERIVED = re.compile(r"<!--\s*derived:(?P<body>.*?)-->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
URL = re.compile(r"<?https?://\S+")


def block_pattern() -> re.Pattern[str]:
    """The generated-block markers as ``tools/pages.py`` spells them (``BLOCK``, in
    ``tools/pagegen/markers.py``), read from its source without running it (the generator
    imports the whole command line)."""
    source = ROOT / "tools" / "pagegen" / "markers.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BLOCK"
                                                 for t in node.targets)
                and isinstance(node.value, ast.Call) and node.value.args):
            pattern = ast.literal_eval(node.value.args[0])
            flags = 0
            for flag in ast.walk(node.value.args[1]) if len(node.value.args) > 1 else ():
                if isinstance(flag, ast.Attribute):
                    flags |= getattr(re, flag.attr)
            return re.compile(pattern, flags)
    raise AssertionError(f"{source}: no `BLOCK = re.compile(...)` to read the page markers from")


BLOCK = block_pattern()


# -- the sources --------------------------------------------------------------------------------
def numbers_in(value: Any) -> Iterator[float]:
    """Every number of a parsed JSON/YAML document (booleans are not numbers)."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        if math.isfinite(value):
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from numbers_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from numbers_in(v)


def record_numbers(path: Path) -> Iterator[float]:
    """The numbers of one record file: JSON, JSON lines or YAML; other files have none."""
    if path.suffix == ".json":
        yield from numbers_in(read_json(path))
    elif path.suffix == ".jsonl":
        for i, line in enumerate(read_lines(path), 1):
            if line.strip():
                yield from numbers_in(parse_json(line, f"{path}, line {i}"))
    elif path.suffix == ".yaml":
        yield from numbers_in(load_yaml(path))


def significant_digits(number: str) -> int:
    """``63.1``: 3, ``0.34``: 2, ``0.10``: 2 (leading zeros do not count)."""
    return len(number.replace(".", "").lstrip("0"))


def record_files(pattern: str) -> list[Path]:
    """The record files a PAGES entry names: a file, or every run's record files under a
    folder (and any other JSON there: the −GATES probes are one JSON file each)."""
    found = sorted(Path(p) for p in glob.glob(str(ROOT / pattern)))
    assert found, f"PAGES names {pattern}, which matches nothing under {ROOT}"
    files = []
    run_files = {RunNames.RESULT, RunNames.METRICS, RunNames.CONFIG, RunNames.ENV}
    for path in found:
        if path.is_file():
            files.append(path)
        else:
            files.extend(p for p in sorted(path.rglob("*")) if p.is_file()
                         and (p.name in run_files or (p.suffix == ".json"
                                                      and RunNames.SCORES not in p.parts)))
    return files


@dataclass
class Backing:
    """What a page's prose may quote, loaded once per page."""

    block_numbers: set[str]       # numbers of the page's generated blocks, as written
    block_integers: set[int]      # integers of the generated blocks (derived operands)
    values: list[float]           # every number of the records and the reference blocks
    exact: set[float]             # the same, as a set (their magnitudes)
    reference_text: set[str]      # the decimals of the reference_source texts, as written
    _formatted: dict[int, set[str]]

    def formatted(self, decimals: int) -> set[str]:
        if decimals not in self._formatted:
            self._formatted[decimals] = {f"{abs(v):.{decimals}f}" for v in self.values}
        return self._formatted[decimals]

    def backs(self, number: str) -> bool:
        """Shown in a block or a reference_source as written; equal to a record's or a
        reference's value; or, with at least MIN_ROUNDED_DIGITS significant digits, one of
        them rounded to the number's decimals."""
        decimals = len(number.split(".")[1])
        return (number in self.block_numbers or number in self.reference_text
                or float(number) in self.exact
                or (significant_digits(number) >= MIN_ROUNDED_DIGITS
                    and number in self.formatted(decimals)))

    def backs_integer(self, value: int) -> bool:
        return (value in UNITS or value in self.block_integers
                or any(float(v) == value for v in self.values))


def load_backing(text: str, sources: Sources) -> Backing:
    blocks = "\n".join(m.group(0) for m in BLOCK.finditer(text))
    block_numbers = set(NUMBER.findall(blocks))
    block_integers = {int(n.replace(",", "")) for n in INTEGER.findall(blocks)}
    values: list[float] = []
    for pattern in sources.records:
        for path in record_files(pattern):
            values.extend(record_numbers(path))
    reference_text: set[str] = set()
    for pattern in sources.recipes:
        recipes = sorted((ROOT / "recipes").glob(f"{pattern}.yaml"))
        assert recipes, f"PAGES names the recipe {pattern}, which matches no recipes/*.yaml"
        for path in recipes:
            recipe = load_yaml(path)
            values.extend(numbers_in(recipe))  # its settings and its reference block
            reference_text.update(NUMBER.findall(str(recipe.get("reference_source") or "")))
    return Backing(block_numbers, block_integers, values, {abs(v) for v in values},
                   reference_text, {})


# -- the prose ----------------------------------------------------------------------------------
def blank(match: re.Match[str]) -> str:
    """A match replaced by its newlines only, so that line numbers stay the page's."""
    return "\n" * match.group(0).count("\n")


def prose_numbers(text: str) -> Iterator[tuple[int, str]]:
    """(line, number) of every checked number of the prose outside generated blocks."""
    for pattern in (BLOCK, FENCE, COMMENT):
        text = pattern.sub(blank, text)
    for lineno, line in enumerate(text.split("\n"), 1):
        for pattern in (INLINE_CODE, LINK_TARGET, URL):
            line = pattern.sub(" ", line)
        for m in NUMBER.finditer(line):
            if not VERSION.search(line[:m.start()]):
                yield lineno, m.group(1)


def derived_markers(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, number, expression) of every derived marker of the page (not those shown as
    code: a page may show the marker's form in backticks)."""
    for pattern in (BLOCK, FENCE):
        text = pattern.sub(blank, text)
    text = INLINE_CODE.sub(" ", text)
    for m in DERIVED.finditer(text):
        lineno = text.count("\n", 0, m.start()) + 1
        for part in m.group("body").split(";"):
            if part.strip():
                number, sep, expression = part.partition("=")
                assert sep, (f"line {lineno}: a derived marker reads NUMBER = EXPRESSION, "
                             f"not {part.strip()!r}")
                yield lineno, number.strip(), expression.strip()


def evaluate(expression: str, backing: Backing, where: str) -> float:
    """The value of a derived expression of numbers, + - * / and parentheses (parsed with
    ast, never run as code), each operand checked against the sources."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise AssertionError(f"{where}: {expression!r} is not an arithmetic expression "
                             f"({e.msg})") from None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult,
                                                                ast.Div)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise AssertionError(f"{where}: {expression!r} divides by zero")
            return left / right
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            written = ast.get_source_segment(expression, node) or repr(node.value)
            backed = (backing.backs_integer(node.value) if isinstance(node.value, int)
                      else "." in written and "e" not in written.lower()
                      and backing.backs(written))
            if not backed:
                raise AssertionError(f"{where}: the operand {written} of {expression!r} is in "
                                     "no generated block, record or recipe of the page")
            return float(node.value)
        raise AssertionError(f"{where}: {expression!r} may hold only numbers, + - * / and "
                             f"parentheses, not {ast.dump(node)[:60]}")

    return value(tree)


def problems_of(shown: str, text: str, sources: Sources) -> list[str]:
    """Every number of the prose of a page (``shown``: its name in the messages) that nothing
    backs, and every derived marker that does not hold, each named with its line."""
    backing = load_backing(text, sources)
    derived: dict[str, str] = {}
    problems = []
    for lineno, number, expression in derived_markers(text):
        where = f"{shown}, line {lineno}"
        number = number.lstrip("-−")
        if not NUMBER.fullmatch(number):
            problems.append(f"{where}: a derived marker names {number!r}, not a decimal number")
            continue
        try:
            got = evaluate(expression, backing, where)
        except AssertionError as e:
            problems.append(str(e))
            continue
        decimals = len(number.split(".")[1])
        if f"{abs(got):.{decimals}f}" != number:
            problems.append(f"{where}: the derived {number} = {expression} is "
                            f"{abs(got):.{decimals}f}, not {number}")
            continue
        derived[number] = expression
    quoted = set()
    for lineno, number in prose_numbers(text):
        quoted.add(number)
        if not (backing.backs(number) or number in derived):
            problems.append(
                f"{shown}, line {lineno}: {number} is in no generated block of the page, no "
                f"record it names ({', '.join(sources.records) or 'none'}) and no recipe of it "
                f"({', '.join(sources.recipes) or 'none'}): correct it, show it in a generated "
                f"block, or mark it <!-- derived: {number} = EXPRESSION -->")
    for number in sorted(set(derived) - quoted):
        problems.append(f"{shown}: the derived marker of {number} backs no number of the prose: "
                        "remove it")
    return problems


@pytest.mark.parametrize("page", sorted(PAGES))
def test_prose_numbers_are_backed(page):
    """Every checked number of the page's prose comes from its generated blocks, its records,
    its recipes or a derived marker whose expression gives it."""
    problems = problems_of(f"docs/results/{page}", read_text(RESULTS / page), PAGES[page])
    assert not problems, "\n".join(problems)


# -- the checker itself, on hand-made pages -----------------------------------------------------
def backing_of(values=(), blocks="", reference=""):
    return Backing(set(NUMBER.findall(blocks)), set(), list(values),
                   {abs(v) for v in values}, set(NUMBER.findall(reference)), {})


def test_prose_numbers_skip_code_versions_blocks_and_comments():
    text = ("# lr 1.0\n"
            "<!-- generated: pages runs x -->\n| 36.48 |\n<!-- /generated -->\n"
            "Ours 36.48, `--set train.lr=0.2`, PyTorch 2.13.0+cpu, UD 2.16, v1.1, §6.2.\n"
            "```bash\nlstmablate train --set train.lr=0.3\n```\n"
            "<!-- a comment 9.99 -->\n[below](#gates-at-lr-1.0), 3.49-3.62 nats; −1.2 and 2.7 %.\n")
    assert list(prose_numbers(text)) == [(1, "1.0"), (5, "36.48"), (10, "3.49"), (10, "3.62"),
                                         (10, "1.2"), (10, "2.7")]


def test_backing_matches_at_the_precision_shown():
    backing = backing_of(values=[63.06408999, 0.1, 822752126], blocks="| 36.48 |",
                         reference="LSTM 38.19 ± 0.1")
    assert backing.backs("63.1") and backing.backs("63.06") and not backing.backs("63.0")
    assert backing.backs("36.48") and not backing.backs("36.5")  # a block's number as written
    assert backing.backs("38.19") and backing.backs("0.10")
    assert not backing.backs("38.2")
    assert backing.backs_integer(822752126) and backing.backs_integer(100)
    assert not backing.backs_integer(7)


def test_derived_expressions_are_arithmetic_on_backed_numbers():
    backing = backing_of(values=[822752126], blocks="| 36.48 |", reference="LSTM 38.19")
    assert round(evaluate("38.19 - 36.48", backing, "here"), 2) == 1.71
    assert evaluate("822752126 / 1000000", backing, "here") == pytest.approx(822.752126)
    assert evaluate("-(38.19 - 36.48) * 100 / 100", backing, "here") == pytest.approx(-1.71)
    with pytest.raises(AssertionError, match="operand 37.00"):
        evaluate("38.19 - 37.00", backing, "here")          # 37.00 comes from nowhere
    with pytest.raises(AssertionError, match="operand 7"):
        evaluate("38.19 * 7", backing, "here")
    for code in ("__import__('os').getcwd()", "38.19 ** 2", "abs(36.48)", "36.48 if 1 else 0",
                 "[36.48][0]", "'36.48'"):
        with pytest.raises(AssertionError, match="may hold only|not an arithmetic"):
            evaluate(code, backing, "here")


def test_derived_markers_are_read_from_comments():
    text = "a\n<!-- derived: 1.7 = 38.19 - 36.48; 0.3 = 36.76 - 36.48 -->\nb\n"
    assert list(derived_markers(text)) == [(2, "1.7", "38.19 - 36.48"),
                                           (2, "0.3", "36.76 - 36.48")]


def test_a_page_is_checked_against_its_records_and_recipes(tmp_path):
    """A hand-made page over a hand-made run record and the nmt-multi30k recipe: the number
    nothing backs is named with its page and line; a derived marker backs it only when its
    expression, on backed operands, gives the number."""
    run = tmp_path / "nmt" / "lstm" / "seed-1"
    (run / RunNames.SCORES).mkdir(parents=True)
    (run / RunNames.RESULT).write_text('{"test": {"bleu": 36.475329618825846}}')
    (run / RunNames.METRICS).write_text('{"epoch": 1, "ppl": 80.1123}\n')
    (run / RunNames.SCORES / "test.jsonl").write_text('{"bleu": 12.345}\n')  # not a record
    sources = Sources(records=(str(tmp_path / "nmt"),), recipes=("nmt-multi30k",))
    page = ("# Table 4\n\n"
            "Ours 36.48 (valid ppl 80.11 after epoch 1) against the paper's 38.19 ± 0.1,\n"
            "1.7 under it; lr 1.0. The per-item score 12.35 is no record.\n")
    problems = problems_of("page.md", page, sources)
    assert [p.split(" is in no")[0] for p in problems] == ["page.md, line 4: 1.7",
                                                          "page.md, line 4: 12.35"]
    assert "mark it <!-- derived: 1.7 = EXPRESSION -->" in problems[0]

    marked = page.replace("12.35", "12").replace(
        "# Table 4\n", "# Table 4\n<!-- derived: 1.7 = 38.19 - 36.48 -->\n")
    assert problems_of("page.md", marked, sources) == []
    wrong = marked.replace("1.7 = 38.19 - 36.48", "1.7 = 38.19 - 36.48 + 0.1")
    problems = problems_of("page.md", wrong, sources)
    assert problems[0] == "page.md, line 2: the derived 1.7 = 38.19 - 36.48 + 0.1 is 1.8, not 1.7"
    assert problems[1].startswith("page.md, line 5: 1.7 is in no") and len(problems) == 2
    unsourced = marked.replace("1.7 = 38.19 - 36.48", "1.7 = 38.19 - 36.49")
    assert "the operand 36.49" in problems_of("page.md", unsourced, sources)[0]
    stale = marked.replace("1.7 under it", "under it")
    assert problems_of("page.md", stale, sources) == [
        "page.md: the derived marker of 1.7 backs no number of the prose: remove it"]
