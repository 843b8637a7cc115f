"""The bwb task end to end on the small corpus of tests/fixtures/bwb: the 2048-512 architecture at
a small size (LSTM with a projection), sampled softmax in training, full softmax in evaluation,
Adagrad as Józefowicz et al., and one data-parallel step (2 CPU processes, gloo)."""

from __future__ import annotations

import functools
import gc
import math
import os
from pathlib import Path

import pytest
import torch

from tolerance import assert_close
from lstmablate.cells import build_encoder
from lstmablate_tasks.bwb.task import BillionWordTask

from item_scores_check import assert_round_trip

FIXTURE = Path(__file__).parent / "fixtures" / "bwb"
SMALL = dict(emb_size=16, hidden_size=32, proj_size=12, num_sampled=10, emb_grad_scale=4.0)


def make_task(B=8, T=6, **model):
    cfg = {**SMALL, **model}
    task = BillionWordTask(BillionWordTask.DataConfig(batch_size=B, num_steps=T, vocab_size=0),
                           BillionWordTask.ModelConfig(**cfg),
                           FIXTURE, eval_cfg=BillionWordTask.EvalConfig(batch_size=4, num_steps=5))
    task.use_artefacts(task.build_artefacts())
    task.setup(["train", "dev", "test"])
    return task


def build(task, cell="lstm", seed=0):
    torch.manual_seed(seed)
    return task.build_model(functools.partial(build_encoder, cell))


def test_model_is_the_projected_lstm():
    task = make_task()
    model = build(task)
    cell = model.encoder.cells()[0]
    assert model.encoder.output_size == 12 and tuple(model.softmax_w.shape) == (42, 12)
    assert tuple(cell.weight_hr.shape) == (12, 32)  # h_t = W_hr (o_t * tanh(c_t))
    # forget_bias 1.0 (their LSTMCell adds 1 to the forget pre-activation); other biases 0
    f = cell.blocks.index("f") * 32
    bias = cell.bias.detach()
    assert bool((bias[f:f + 32] == 1.0).all()) and float(bias.abs().sum()) == 32.0
    # glorot on the [x; h] -> 4H kernel: |w| <= sqrt(6 / (16 + 12 + 128))
    assert cell.weight_ih.abs().max() <= math.sqrt(6 / (16 + 12 + 128))
    a = math.sqrt(3 / math.ceil(42 / 8))  # uniform_unit_scaling on one of 8 row shards
    assert model.embedding.weight.abs().max() <= a and model.softmax_w.abs().max() <= a


def test_training_lowers_dev_perplexity_and_eval_is_the_full_softmax():
    torch.set_num_threads(1)
    task = make_task()
    model = build(task)
    before = task.evaluate(model, "dev")
    opt = torch.optim.Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0)
    plan = task.train_plan(0, torch.Generator().manual_seed(0))
    carry, losses = task.init_carry(model), []
    for epoch in range(3):
        plan = task.train_plan(epoch, torch.Generator().manual_seed(epoch))
        for i in range(len(plan)):
            out = task.loss(model, plan[i], carry)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            carry = out.carry
            losses.append(out.loss.item())
    after = task.evaluate(model, "dev")
    assert len(losses) > 60 and sum(losses[-10:]) < 0.8 * sum(losses[:10])
    assert after["ppl"] < 0.6 * before["ppl"]
    # every prediction of the held-out shard is scored: sum over sentences of (words + 1)
    lines = (FIXTURE / "bwb" / "heldout-monolingual.tokenized.shuffled" /
             "news.en.heldout-00001-of-00050").read_text().splitlines()
    assert after["tokens"] == sum(len(line.split()) + 1 for line in lines)
    assert after["ppl"] == pytest.approx(math.exp(after["nll"]))
    # evaluation = the full softmax over all 42 words, whatever num_sampled is
    model.eval()
    x, y, _ = plan[0]
    with torch.no_grad():
        nll, _ = model(x, y)
        h, _ = model.hidden(x, None)
        logits = h @ model.softmax_w.t() + model.softmax_b
        ref = -torch.log_softmax(logits, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    assert_close(nll, ref)  # float32, computed two ways


def test_training_loss_uses_the_sampled_softmax():
    task = make_task()
    model = build(task)
    x, y, w = task.train_plan(0, torch.Generator().manual_seed(0))[0]
    torch.manual_seed(1)
    sampled = task.loss(model, (x, y, w), None).loss
    model.sampler = None  # the full softmax, for comparison
    torch.manual_seed(1)
    full = task.loss(model, (x, y, w), None).loss
    assert sampled.item() != pytest.approx(full.item(), rel=1e-3)
    # the loss is num_steps x the mean NLL (the sum over time of the batch-mean NLL)
    model.eval()
    with torch.no_grad():
        nll, _ = model(x, y)
    model.train()
    model.dropout = 0.0
    assert task.loss(model, (x, y, w), None).loss.item() == pytest.approx(6 * nll.mean().item(),
                                                                          rel=1e-5)


def test_embedding_gradient_is_scaled():
    task = make_task(emb_grad_scale=1.0)
    model = build(task)
    batch = task.train_plan(0, torch.Generator().manual_seed(0))[0]
    torch.manual_seed(3)
    task.loss(model, batch, None).loss.backward()
    g1 = model.embedding.weight.grad.clone()
    scaled = build(make_task(emb_grad_scale=4.0))
    torch.manual_seed(3)
    task.loss(scaled, batch, None).loss.backward()
    assert torch.allclose(scaled.embedding.weight.grad, 4.0 * g1, atol=1e-6)


# -- one data-parallel step ----------------------------------------------------------------

def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from lstmablate.batching import shard_batch
    from lstmablate.train.distributed import DistInfo, all_reduce_sum, cleanup

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    info = DistInfo(rank, world, rank)
    for num_sampled in (0, 10):  # full softmax, and the sampled softmax of training
        task = make_task(num_sampled=num_sampled, dropout=0.0)
        model = build(task)
        ddp = DistributedDataParallel(model)
        batch = shard_batch(task.train_plan(0, torch.Generator().manual_seed(0))[0], info)
        torch.manual_seed(7)  # every process draws the same candidate set, as one process would
        out = task.loss(ddp, batch, None)
        # the trainer's weighting: each slice's mean loss by its share of the global weight
        total = all_reduce_sum(out.weight, info, torch.device("cpu"))
        (out.loss * (out.weight * world / total)).backward()
        if rank == 0:
            torch.save({n: p.grad for n, p in model.named_parameters()},
                       Path(out_dir) / f"ddp-{num_sampled}.pt")
        del ddp, model, out  # nothing of the group's work outlives the group
    # leave together, as the runner does (a group or its work still alive at interpreter exit
    # can abort the process from gloo's threads)
    gc.collect()
    cleanup(info)


@pytest.mark.slow
def test_one_ddp_step_matches_one_process(tmp_path):
    """Two processes, each with half of the global batch (the trainer's shard_batch and loss
    weighting), give the gradients of one process on the whole batch."""
    import torch.multiprocessing as mp

    env = dict(os.environ)
    try:
        mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    except Exception as e:  # pragma: no cover - builds without gloo
        if "gloo" in str(e).lower() and "not available" in str(e).lower():
            pytest.skip("this PyTorch build has no gloo backend")
        raise
    finally:
        os.environ.clear()
        os.environ.update(env)
    for num_sampled in (0, 10):
        task = make_task(num_sampled=num_sampled, dropout=0.0)
        model = build(task)
        batch = task.train_plan(0, torch.Generator().manual_seed(0))[0]
        torch.manual_seed(7)
        task.loss(model, batch, None).loss.backward()
        ddp = torch.load(tmp_path / f"ddp-{num_sampled}.pt")
        for name, p in model.named_parameters():
            assert torch.allclose(ddp[name], p.grad, atol=1e-5, rtol=1e-4), (num_sampled, name)


def test_sparse_gradients_give_the_same_adagrad_step():
    batch = make_task().train_plan(0, torch.Generator().manual_seed(0))[0]
    params = []
    for sparse in (False, True):
        task = make_task(sparse_grads=sparse)
        model = build(task)
        opt = torch.optim.Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0)
        torch.manual_seed(4)
        task.loss(model, batch, None).loss.backward()
        assert model.softmax_w.grad.is_sparse == model.embedding.weight.grad.is_sparse == sparse
        opt.step()
        params.append(dict(model.named_parameters()))
    for name, p in params[0].items():
        assert_close(p, params[1][name], msg=name)  # float32: sparse vs dense accumulation


def test_predictions_file_gives_the_evaluation(tmp_path):
    task = make_task()
    model = build(task)
    metrics = task.evaluate(model, "test")
    from_file = task.write_predictions(model, "test", tmp_path / "pred.tsv")
    assert from_file["tokens"] == metrics["tokens"]
    assert from_file["ppl"] == pytest.approx(metrics["ppl"], rel=1e-12)
    lines = (tmp_path / "pred.tsv").read_text().splitlines()
    assert lines[1] == "sentence\tindex\ttoken\tlogprob"
    first = (FIXTURE / "bwb" / "heldout-monolingual.tokenized.shuffled" /
             "news.en.heldout-00000-of-00050").read_text().splitlines()[0].split()
    rows = [line.split("\t") for line in lines[2:2 + len(first) + 1]]
    assert [r[:2] for r in rows] == [["0", str(i)] for i in range(1, len(first) + 2)]
    assert [r[2] for r in rows] == [w if w in task.vocab.stoi else "<UNK>" for w in first] + ["<S>"]


def test_per_sentence_scores_recompute_the_perplexity(tmp_path):
    """scores/test.jsonl round trip: each held-out sentence's summed NLL and predictions (its
    words and the closing <S>) give the perplexity; the NLLs are the predictions file's."""
    task = make_task()
    model = build(task)
    metrics, records = assert_round_trip(task, model, "test", tmp_path)
    lines = (FIXTURE / "bwb" / "heldout-monolingual.tokenized.shuffled" /
             "news.en.heldout-00000-of-00050").read_text().splitlines()
    assert [r["tokens"] for r in records] == [len(line.split()) + 1 for line in lines]
    task.write_predictions(model, "test", tmp_path / "pred.tsv")
    per_line = [0.0] * len(lines)
    for row in (tmp_path / "pred.tsv").read_text().splitlines()[2:]:
        sentence, _, _, lp = row.split("\t")
        per_line[int(sentence)] -= float(lp)
    assert [r["nll"] for r in records] == pytest.approx(per_line, rel=1e-12)
