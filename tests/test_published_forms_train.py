"""The simpler recurrences' published forms (``sru`` with ``init: authors``, ``mingru`` and
``minlstm`` with ``mode: log``) as a run gets them: from ``model.cell_options`` through the
config's checks and a task's model, on their fast paths, and they learn (a few Adam steps on
the tiny Dyck fixture, the loss falls, as tests/test_registry_on_dyck.py holds every cell)."""

from __future__ import annotations

import functools

import pytest
import torch

from lstmablate.cells import build_encoder
from lstmablate.cells.kernels.interface import kernel_name_of
from lstmablate.errors import ConfigError
from lstmablate.recipes import resolve_config
from lstmablate.train.position import data_generator
from lstmablate_tasks.dyck.task import DyckTask

FORMS = [("sru", "{init: authors}", "recurrent"), ("mingru", "{mode: log}", "scan"),
         ("minlstm", "{mode: log}", "scan")]


@pytest.mark.parametrize("cell,options,path", FORMS, ids=[f[0] for f in FORMS])
def test_the_published_form_learns_on_dyck(cell, options, path, tiny_recipe):
    cfg = resolve_config(DyckTask, cell, recipe=str(tiny_recipe),
                         overrides=[f"model.cell_options={options}", "data.batch_size=32"])
    torch.manual_seed(0)
    task = DyckTask(cfg.data, cfg.model, tiny_recipe.parent)
    task.setup()
    model = task.build_model(functools.partial(build_encoder, cell))
    rnn = next(m for m in model.modules() if hasattr(m, "cells")).cells()[0]
    assert (rnn.init == "authors") if cell == "sru" else rnn.log_space
    assert kernel_name_of(rnn).startswith(path)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.03)
    batch = task.train_plan(0, data_generator(1, 0))[0]
    first = task.loss(model, batch, None).loss.item()
    for _ in range(25):
        opt.zero_grad()
        task.loss(model, batch, None).loss.backward()
        opt.step()
    last = task.loss(model, batch, None).loss.item()
    assert last < first - 0.05, f"{cell}: loss {first:.4f} -> {last:.4f}"


def test_a_misspelt_form_is_refused_before_any_data_is_read(tiny_recipe):
    with pytest.raises(ConfigError, match="model.cell_options.mode: cell 'minlstm' takes one of"):
        resolve_config(DyckTask, "minlstm", recipe=str(tiny_recipe),
                       overrides=["model.cell_options={mode: logspace}"])
    with pytest.raises(ConfigError, match="cell_options"):
        resolve_config(DyckTask, "sru-2017", recipe=str(tiny_recipe),
                       overrides=["model.cell_options={init: authors}"])
