"""``pages headline DIR``: the README's table of the five paper cells across tasks
(``tools/pages.py``; :data:`HEADLINE`: one column per task, the mean over seeds of one test
metric, the paper's number in brackets, a learning rate that differs from its recipe's named).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from .markers import ROOT, PageError, Parser
from .tables import Run, find, machines, number, paper_number, recipe_of

@dataclass(frozen=True)
class HeadlineColumn:
    """One column of the README's headline table: the mean over seeds of ``metric`` in the test
    section of the runs of ``experiments``, with ``paper_recipe``'s reference number."""

    title: str
    short: str  # the column's name in the notes under the table
    experiments: tuple[str, ...]
    metric: str
    paper_recipe: str | None
    spec: str = ".2f"


#: the five paper cells, in the paper's order, as the headline names them
PAPER_CELLS = (("LSTM", "lstm"), ("−S-RNN", "lstm-srnn"), ("−S-RNN−OUT", "lstm-srnn-out"),
               ("−S-RNN−HIDDEN", "lstm-srnn-hidden"), ("−GATES", "lstm-gates"))
HEADLINE = (
    HeadlineColumn("[PTB small (CPU, 13 epochs)](docs/results/table1-ptb.md)<br>test ppl ↓",
                   "PTB small", ("ptb-small",), "ppl", None),
    HeadlineColumn("[PTB medium (paper scale, GPU)]"
                   "(docs/results/table1-ptb.md#ptb-medium-at-the-papers-scale)<br>test ppl ↓",
                   "PTB medium", ("ptb-medium",), "ppl", "ptb-medium"),
    HeadlineColumn("[SQuAD stand-in (dev split)](docs/results/table2-squad.md)<br>DrQA F1 ↑",
                   "DrQA", ("squad-drqa-standin-dev-split",), "f1", "squad-drqa"),
    HeadlineColumn("[SQuAD stand-in (dev split)](docs/results/table2-squad.md)<br>BiDAF F1 ↑",
                   "BiDAF", ("squad-bidaf-standin-dev-split",), "f1", "squad-bidaf"),
    HeadlineColumn("[UD EWT (CPU stand-in 3×100)](docs/results/table3-parsing.md)<br>LAS ↑",
                   "UD EWT", ("parsing-ewt-cpu",), "las", "parsing-ewt"),
    HeadlineColumn("[Multi30k (CPU 2×256)](docs/results/table4-nmt.md)<br>BLEU ↑",
                   "Multi30k", ("nmt-multi30k-cpu",), "bleu", "nmt-multi30k"),
    # the paper's size on one GPU: the LSTM whole, the ablations' first 8-9 of 13 epochs
    HeadlineColumn("[Multi30k (paper scale, GPU; ablations 8-9 of 13 epochs)]"
                   "(docs/results/table4-nmt.md)<br>BLEU ↑",
                   "Multi30k paper scale", ("nmt-multi30k",), "bleu", "nmt-multi30k"),
    HeadlineColumn("[Dyck demo](docs/results/dyck.md)<br>WCPA mean ↑",
                   "Dyck", ("dyck-demo",), "wcpa_mean", None, ".1f"),
)


def headline(argv: list[str]) -> str:
    """``pages headline DIR``: the README's table (:data:`HEADLINE`)."""
    parser = Parser(prog="pages headline")
    parser.add_argument("runs_dir")
    args = parser.parse_args(argv)
    if not (ROOT / args.runs_dir).is_dir():  # (else every column would be a dash)
        raise PageError(f"pages headline: {args.runs_dir} is not a folder of run records "
                        "(relative to the repository root)")
    rows = {cell: [f"{name} (`{cell}`)"] for name, cell in PAPER_CELLS}
    seeds: dict[str, list[str]] = {}
    where: list[str] = []
    missing: dict[str, list[str]] = {}
    for col in HEADLINE:
        runs = [r for e in col.experiments for r in find_or_none(args.runs_dir, e)]
        reference = (recipe_of(col.paper_recipe).get("reference") or {}) if col.paper_recipe else {}
        shown: list[Run] = []  # the runs in the table, whose machines the column names
        for _, cell in PAPER_CELLS:
            mine = [r for r in runs if r.cell == cell]
            shown += mine
            if not mine:
                rows[cell].append("—")
                missing.setdefault(col.short, []).append(f"`{cell}`")
                continue
            twice = sorted(s for s, n in Counter(r.seed for r in mine).items() if n > 1)
            if twice:  # a re-run or a copy is not a new seed
                raise PageError(f"pages headline: column {col.short!r} pools runs of "
                                f"{', '.join(col.experiments)} in which `{cell}` has seed(s) "
                                f"{', '.join(map(str, twice))} more than once; its mean would "
                                "count one seed twice. Keep one experiment per cell in the "
                                "column (tools/pagegen/headline.py, HEADLINE).")
            text = number(statistics.mean(r.row[f"test.{col.metric}"] for r in mine), col.spec)
            paper = (reference.get(cell) or {}).get(col.metric)
            if paper is not None:
                text += f" ({paper_number(paper)})"
            lr = mine[0].config()["train"]["lr"]
            if lr != recipe_of(mine[0].row["recipe"])["train"]["lr"]:
                text += f", lr {lr:g}"
            rows[cell].append(text)
            if len(mine) > 1:
                seeds.setdefault(col.short, []).append(f"`{cell}` {len(mine)}")
        if shown:
            where.append(f"{col.short}: {machines(shown, args.runs_dir)}")
    lines = ["| cell | " + " | ".join(c.title for c in HEADLINE) + " |",
             "|" + "---|" * (len(HEADLINE) + 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows.values()]
    notes = ["Ours: the mean over the seeds kept ("
             + "; ".join(f"{short}: {', '.join(cells)} seeds" for short, cells in seeds.items())
             + "; every other entry one run, seed 1); a learning rate is named where it differs "
             "from the recipe's."]
    if missing:
        notes.append("—: no run record in the repository ("
                     + "; ".join(f"{short}: {', '.join(cells)}" for short, cells in missing.items())
                     + ").")
    notes.append("Machines (from the runs' `env.json`):\n\n" + "\n".join(f"* {w}" for w in where))
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def find_or_none(runs_dir: str, experiment: str) -> list[Run]:
    """The finished runs of one experiment, none if it has no folder yet."""
    if not (ROOT / runs_dir / experiment).is_dir():
        return []
    return find(runs_dir, [experiment])
