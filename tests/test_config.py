"""Config resolution: defaults -> recipe -> --set, typed and validated before any data loads."""

from __future__ import annotations

import pytest

from lstmablate.config import TrainConfig, convert, parse_overrides

from lstmablate.recipes import resolve_config
from lstmablate.errors import ConfigError, UnknownNameError
from lstmablate.run.runs import RunFiles
from lstmablate.task import get_task
from lstmablate_tasks.dyck.task import DyckTask


def test_defaults_then_recipe_then_overrides(tiny_recipe, monkeypatch):
    cfg = resolve_config(DyckTask, "lstm")
    assert cfg.train.optimizer == "adam" and cfg.train.lr == 0.01  # task defaults (Hewitt)
    assert cfg.experiment == "dyck" and cfg.data.train_tokens == 200_000
    with pytest.raises(ConfigError, match="exactly one of data.train_tokens"):
        resolve_config(DyckTask, "lstm", overrides=["data.train_sequences=10"])

    cfg = resolve_config(DyckTask, "lstm", recipe=str(tiny_recipe))
    assert cfg.data.m == 3 and cfg.model.hidden_size == 8 and cfg.train.lr == 0.02
    assert cfg.experiment == "tiny" and cfg.seed == 1
    assert cfg.recipe == "tiny" and cfg.recipe_file == str(tiny_recipe.resolve())
    # what the recipe says about the sweep (cells, seeds, the paper's numbers) stays in it
    saved = cfg.to_dict()
    assert not {"cells", "seeds", "cell_seeds", "reference", "reference_source"} & set(saved)
    assert set(cfg.identity()) == {"task", "cell", "seed", "data", "model", "train"}

    # a recipe named (not a file given): the run records no path, and the report looks the
    # name up as `train` did (a shipped recipe, or one of $LSTMABLATE_RECIPES)
    by_name = resolve_config(get_task("ptb"), "lstm", recipe="ptb-small")
    assert by_name.recipe == "ptb-small" and by_name.recipe_file is None
    monkeypatch.setenv("LSTMABLATE_RECIPES", str(tiny_recipe.parent))
    by_name = resolve_config(DyckTask, "lstm", recipe="tiny")
    assert by_name.recipe == "tiny" and by_name.recipe_file is None
    assert by_name.identity() == resolve_config(DyckTask, "lstm", recipe=str(tiny_recipe)).identity()

    cfg = resolve_config(DyckTask, "lstm", recipe=str(tiny_recipe), seed=7,
                         overrides=["train.lr=0.5", "train.max_steps=3", "model.num_layers=2",
                                    "train.betas=[0.9, 0.9]", "train.eval_test=false"])
    assert cfg.train.lr == 0.5 and isinstance(cfg.train.lr, float)
    assert cfg.train.max_steps == 3 and isinstance(cfg.train.max_steps, int)
    assert cfg.model.num_layers == 2
    assert cfg.train.betas == (0.9, 0.9)
    assert cfg.train.eval_test is False
    assert cfg.seed == 7


def test_how_often_last_pt_is_saved_and_how_a_step_runs_are_not_a_runs_identity(tiny_recipe):
    """--resume compares identities: a run may continue with another save period or step
    capture, never with another rate."""
    def identity(*overrides):
        return resolve_config(DyckTask, "lstm", recipe=str(tiny_recipe),
                              overrides=list(overrides)).identity()
    base = identity()
    assert identity("train.save_every_minutes=2") == base
    assert identity("train.save_every_minutes=0", "train.step_capture=off",
                    "train.capture_slots=3") == base
    assert identity("train.lr=0.5") != base


def test_unknown_key_suggests_the_right_one(tiny_recipe):
    with pytest.raises(UnknownNameError) as e:
        resolve_config(DyckTask, "lstm", recipe=str(tiny_recipe), overrides=["train.max_step=3"])
    assert "train.max_steps" in str(e.value) and "Did you mean" in str(e.value)
    with pytest.raises(ConfigError, match="unknown section 'trian'.*did you mean 'train'"):
        parse_overrides(["trian.lr=1"])
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_overrides(["lr"])


@pytest.mark.parametrize("item, message", [
    ("train.max_steps=1.5", "expected an integer"),
    ("train.lr=fast", "expected a number"),
    ("train.eval_test=maybe", "expected true or false"),
    ("train.betas=[0.9]", "expected 2 values"),
    ("train.optimizer=adamw", "unknown train.optimizer 'adamw'.*Did you mean 'adam'"),
    ("train.lr=-1", "train.lr must be > 0"),
    ("train.lr=nan", "expected a finite number"),
    ("train.max_steps=-5", "train.max_steps must be >= 0"),
])
def test_bad_values_are_rejected(tiny_recipe, item, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(DyckTask, "lstm", recipe=str(tiny_recipe), overrides=[item])


def test_recipe_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: dyck\ntrain:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match=r"bad.yaml, line \d+"):
        resolve_config(DyckTask, "lstm", recipe=str(bad))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("task: dyck\ntrainer:\n  lr: 1\n")
    with pytest.raises(UnknownNameError, match="'trainer'.*Did you mean 'train'"):
        resolve_config(DyckTask, "lstm", recipe=str(unknown))
    wrong_task = tmp_path / "ptb.yaml"
    wrong_task.write_text("task: ptb\n")
    with pytest.raises(ConfigError, match="is for task 'ptb'"):
        resolve_config(DyckTask, "lstm", recipe=str(wrong_task))
    with pytest.raises(UnknownNameError, match="unknown recipe 'dyck-dem'.*Did you mean 'dyck-demo'"):
        resolve_config(DyckTask, "lstm", recipe="dyck-dem")


def test_shipped_recipes_resolve():
    from lstmablate.recipes import available_recipes, load_recipe

    cfg = resolve_config(get_task("dyck"), "lstm", recipe="dyck-demo")
    cfg.data.validate()
    assert cfg.eval.min_bucket_count == 10
    _, recipe = load_recipe("dyck-demo")
    assert set(recipe["cells"]) == {"lstm", "lstm-srnn", "lstm-srnn-out", "lstm-srnn-hidden",
                                    "lstm-gates"}
    for name in available_recipes():  # every shipped recipe resolves for each of its cells
        _, r = load_recipe(name)
        if "task" in r:
            for cell in r.get("cells") or ["lstm"]:
                resolve_config(get_task(r["task"]), cell, recipe=name)


def test_eval_section_is_set_like_the_others_and_renamed_keys_move(tmp_path):
    cfg = resolve_config(DyckTask, "lstm", overrides=["eval.batch_size=7"])
    assert cfg.eval.batch_size == 7
    with pytest.raises(ConfigError, match="eval.batch_size must be >= 1"):
        resolve_config(DyckTask, "lstm", overrides=["eval.batch_size=0"])
    old = tmp_path / "old.yaml"  # a recipe written before eval options had their own section
    old.write_text("task: dyck\ndata:\n  eval_batch_size: 9\n  min_bucket_count: 3\n")
    cfg = resolve_config(DyckTask, "lstm", recipe=str(old))
    assert (cfg.eval.batch_size, cfg.eval.min_bucket_count) == (9, 3)


def test_a_config_saved_by_an_older_version_migrates():
    from lstmablate.config import config_from_dict

    saved = resolve_config(get_task("ptb"), "lstm", recipe="ptb-small").to_dict()
    del saved["eval"], saved["recipe_file"]
    saved["data"]["eval_chunk"] = 123  # where it used to live
    saved.update(cells=["lstm"], seeds=[1], reference={"lstm": {"ppl": 1.0}}, reference_source="x")
    cfg = config_from_dict(get_task("ptb"), saved, RunFiles.CONFIG)
    assert cfg.eval.chunk == 123 and cfg.recipe_file is None


def test_a_key_added_since_reads_the_old_behaviour_in_old_configs(tmp_path):
    """Task.added_keys: a config.yaml saved before model.encoder_lengths existed encoded every
    word, so it reads "all"; a new run gets the dataclass default (Parser-v1's lengths)."""
    from lstmablate.config import config_from_dict

    task = get_task("parsing")
    assert task.ModelConfig().encoder_lengths == "parser-v1"
    saved = resolve_config(task, "lstm", recipe="parsing-ewt-cpu").to_dict()
    assert saved["model"]["encoder_lengths"] == "all"  # the recipe says so
    del saved["model"]["encoder_lengths"]
    assert config_from_dict(task, saved, RunFiles.CONFIG).model.encoder_lengths == "all"
    saved["model"]["encoder_lengths"] = "parser-v1"  # a saved value is kept
    assert config_from_dict(task, saved, RunFiles.CONFIG).model.encoder_lengths == "parser-v1"
    assert resolve_config(task, "lstm", recipe="parsing-ewt").model.encoder_lengths == "parser-v1"
    with pytest.raises(ConfigError, match="encoder_lengths"):
        resolve_config(task, "lstm", recipe="parsing-ewt", overrides=["model.encoder_lengths=some"])


def test_convert_optional_and_lists():
    from typing import Optional

    assert convert("none", Optional[int], "x") is None
    assert convert("3", Optional[int], "x") == 3
    assert convert("a,b", list[str], "x") == ["a", "b"]
    assert convert({"a": 1}, dict, "x") == {"a": 1}
    TrainConfig().validate()


def test_scientific_notation_and_optional_floats(tiny_recipe):
    cfg = resolve_config(DyckTask, "lstm", recipe=str(tiny_recipe),
                         overrides=["train.stop_at=1e-5", "train.lr=2e-3"])
    assert cfg.train.stop_at == 1e-5 and cfg.train.lr == 2e-3
    with pytest.raises(ConfigError, match="expected float or none"):
        resolve_config(DyckTask, "lstm", recipe=str(tiny_recipe), overrides=["train.stop_at=low"])
