"""A finished run evaluated with other eval options than its recipe's (e.g. a beam search
since changed) still counts as finished — the same training — but the sweep says so:
``--status`` per run, a note before anything else."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from lstmablate.run.runs import RunFiles
from lstmablate.run.sweep import eval_differs_note, plan_sweep

RECORD = (Path(__file__).resolve().parents[1] / "experiments" / "results" / "nmt-multi30k-cpu"
          / "lstm-gates" / "seed-1")


def _plan(out: Path):
    items = plan_sweep("nmt-multi30k-cpu", out)
    return {(it.cell, it.seed): it for it in items}


def test_a_run_decoded_another_way_is_finished_and_named(tmp_path):
    run = tmp_path / "nmt-multi30k-cpu" / "lstm-gates" / "seed-1"
    shutil.copytree(RECORD, run)
    cfg = yaml.safe_load((run / RunFiles.CONFIG).read_text())
    # as saved before eval.eos_stop existed: read as the 18d3d2e1 search it ran
    cfg["eval"] = {k: v for k, v in cfg["eval"].items()
                   if k not in ("eos_stop", "also_length_normalised")}
    cfg["eval"]["length_normalise"] = True
    (run / RunFiles.CONFIG).write_text(yaml.safe_dump(cfg))
    item = _plan(tmp_path)[("lstm-gates", 1)]
    assert item.finished and not item.conflict
    assert item.eval_differs == ["eval.also_length_normalised (False -> True)",
                                 "eval.eos_stop (False -> True)",
                                 "eval.length_normalise (True -> False)"]
    note = eval_differs_note(list(_plan(tmp_path).values()))
    assert note.startswith("1 finished run was evaluated with other eval options")
    assert str(run) in note and "lstmablate eval RUN --set" in note
    # evaluated as the recipe says: nothing to say
    cfg["eval"].update(length_normalise=False, eos_stop=True, also_length_normalised=True)
    (run / RunFiles.CONFIG).write_text(yaml.safe_dump(cfg))
    item = _plan(tmp_path)[("lstm-gates", 1)]
    assert item.finished and item.eval_differs == []
    assert eval_differs_note(list(_plan(tmp_path).values())) == ""
