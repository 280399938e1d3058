"""Executor building blocks without processes: the model against a plain implementation, TP
sharding of the initial weights, the synthetic data stream, and the pipeline schedules."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from hetplan.errors import PlanError
from hetplan.runtime.data import SyntheticTokens
from hetplan.runtime.model import ModelConfig, StageModule, TPContext, init_full
from hetplan.runtime.schedule import max_in_flight, run_dataflow, simulate, stage_actions

CFG = ModelConfig(num_layers=2, hidden_size=16, num_heads=4, ffn_hidden_size=24, vocab_size=12, seq_len=6)


def _plain_gpt_loss(params: dict[str, torch.Tensor], tokens: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """GPT-2 style forward written directly from the weights, with torch's own attention kernel."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    n, s = x.shape
    h = params["0/wte"][x] + params["0/wpe"][:s]
    for u in range(1, cfg.num_layers + 1):
        p = {k.split("/", 1)[1]: v for k, v in params.items() if k.startswith(f"{u}/")}
        a = F.layer_norm(h, (cfg.hidden_size,), p["ln1_weight"], p["ln1_bias"], 1e-5)
        q, k, v = (F.linear(a, p[f"attn_{c}_weight"], p[f"attn_{c}_bias"]).view(n, s, cfg.num_heads, -1).transpose(1, 2)
                   for c in "qkv")
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, s, -1)
        h = h + F.linear(att, p["attn_out_weight"], p["attn_out_bias"])
        m = F.layer_norm(h, (cfg.hidden_size,), p["ln2_weight"], p["ln2_bias"], 1e-5)
        h = h + F.linear(F.gelu(F.linear(m, p["mlp_fc1_weight"], p["mlp_fc1_bias"])), p["mlp_fc2_weight"], p["mlp_fc2_bias"])
    head = cfg.num_units - 1
    h = F.layer_norm(h, (cfg.hidden_size,), params[f"{head}/lnf_weight"], params[f"{head}/lnf_bias"], 1e-5)
    logits = h @ params["0/wte"].T
    return F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))


def test_model_matches_plain_gpt():
    model = StageModule(CFG, 0, CFG.num_units, seed=3, dtype=torch.float64)
    with torch.no_grad():  # random LayerNorm / bias values, so those paths are checked too
        for _, p in model.logical_params():
            p.add_(torch.randn(p.shape, dtype=p.dtype, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
    params = {info.key: p for info, p in model.logical_params()}
    tokens = SyntheticTokens(CFG.vocab_size, CFG.seq_len, 1).batch(0, 0, 5)
    # mean over all tokens == mean over sequences of per-sequence means (equal lengths)
    ours = model(tokens[:, :-1], tokens[:, 1:], 1.0 / 5)
    plain = _plain_gpt_loss(params, tokens, CFG)
    assert ours.item() == pytest.approx(plain.item(), rel=1e-12)
    g_ours = torch.autograd.grad(ours, list(params.values()))
    g_plain = torch.autograd.grad(_plain_gpt_loss(params, tokens, CFG), list(params.values()))
    for a, b in zip(g_ours, g_plain):
        assert torch.allclose(a, b, atol=1e-12, rtol=1e-9)


def test_untied_head_has_its_own_weight():
    cfg = ModelConfig(**{**CFG.__dict__, "tied_embeddings": False})
    keys = [i.key for i, _ in StageModule(cfg, 0, cfg.num_units).logical_params()]
    assert "3/lm_head" in keys and keys.count("0/wte") == 1
    tied = [i.key for i, _ in StageModule(CFG, 0, CFG.num_units).logical_params()]
    assert "3/lm_head" not in tied and tied.count("0/wte") == 1  # one Parameter, listed once
    head_only = [i.key for i, _ in StageModule(CFG, 3, 4).logical_params()]
    assert head_only == ["0/wte", "3/lnf_bias", "3/lnf_weight"]  # a copy keyed as the embedding


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_shards_concatenate_to_the_full_initial_weights(tp):
    cfg = ModelConfig(num_layers=1, hidden_size=16, num_heads=4, ffn_hidden_size=24, vocab_size=12, seq_len=6)
    ranks = [StageModule(cfg, 0, cfg.num_units, TPContext(tp, k), seed=5) for k in range(tp)]
    per_rank = [dict((i.key, (i, p)) for i, p in m.logical_params()) for m in ranks]
    for key, (info, _) in per_rank[0].items():
        full = init_full(key, info.full_shape, 5).float()
        parts = [r[key][1].detach() for r in per_rank]
        if info.shard_dim is None:
            assert all(torch.equal(p, full) for p in parts), key
        else:
            assert parts[0].shape[info.shard_dim] * tp == full.shape[info.shard_dim]
            assert torch.equal(torch.cat(parts, dim=info.shard_dim), full), key
    dims = {i.name: i.shard_dim for i, _ in ranks[0].logical_params()}
    assert dims["attn_q_weight"] == 0 and dims["attn_out_weight"] == 1 and dims["mlp_fc2_weight"] == 1
    assert dims["wte"] == 0 and dims["ln1_weight"] is None and dims["attn_out_bias"] is None


def test_shapes_must_divide_by_tp():
    with pytest.raises(PlanError, match="vocab_size 12 is not divisible by tensor-parallel degree 8"):
        ModelConfig(1, 16, 8, 24, 12, 6).check({8})
    with pytest.raises(PlanError, match="hidden_size 10 is not divisible by num_heads 4"):
        ModelConfig(1, 10, 4, 24, 12, 6).check()


def test_synthetic_tokens_are_position_independent_and_follow_the_walk():
    data = SyntheticTokens(vocab_size=50, seq_len=10, seed=4)
    whole = data.batch(3, 0, 8)
    assert whole.shape == (8, 11) and whole.dtype == torch.long
    assert torch.equal(data.batch(3, 5, 8), whole[5:8])  # a replica's range = the reference's rows
    assert not torch.equal(data.batch(4, 0, 8), whole)  # a new iteration, new data
    steps = (whole[:, 1:] - whole[:, :-1]) % 50
    assert set(steps.unique().tolist()) <= {1, 2}
    assert ((whole >= 0) & (whole < 50)).all()


# ---- schedules --------------------------------------------------------------------------------
def test_1f1b_and_gpipe_actions_by_hand():
    assert stage_actions("1F1B", 3, 0, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert stage_actions("1F1B", 3, 2, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert stage_actions("GPipe", 2, 1, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    with pytest.raises(ValueError, match="unknown schedule"):
        stage_actions("ZBV", 2, 0, 2)


@pytest.mark.parametrize("p, m", list(itertools.product(range(1, 6), range(1, 7))))
def test_schedules_are_complete_bounded_and_deadlock_free(p, m):
    for s in range(p):
        for name in ("GPipe", "1F1B"):
            acts = stage_actions(name, p, s, m)
            assert sorted(acts) == sorted([("F", k) for k in range(m)] + [("B", k) for k in range(m)])
            assert all(acts.index(("F", k)) < acts.index(("B", k)) for k in range(m))
        assert max_in_flight(stage_actions("GPipe", p, s, m)) == m
        assert max_in_flight(stage_actions("1F1B", p, s, m)) == min(p - s, m)
    for name in ("GPipe", "1F1B"):
        rounds = simulate(name, p, m)
        assert sum(len(r) for r in rounds) == 2 * p * m
    # GPipe: 2 (m + p - 1) rounds; 1F1B reaches the same makespan in this unit-time dataflow
    assert len(simulate("GPipe", p, m)) == 2 * (m + p - 1)
    assert len(simulate("1F1B", p, m)) == 2 * (m + p - 1)


def test_dataflow_detects_a_deadlocking_order():
    ok = [[("F", 0), ("B", 0)], [("F", 0), ("B", 0)]]
    assert len(run_dataflow(ok)) == 4
    # stage 0 waits for B(1) before sending F(1), which stage 1 needs before it can produce B(1)
    bad = [[("F", 0), ("B", 1), ("F", 1), ("B", 0)], [("F", 0), ("F", 1), ("B", 1), ("B", 0)]]
    with pytest.raises(RuntimeError, match="deadlock"):
        run_dataflow(bad)


def test_loss_at_initialisation_is_near_uniform():
    """Small initial weights give logits near 0: the loss starts at about ln(vocab)."""
    model = StageModule(CFG, 0, CFG.num_units, dtype=torch.float64)
    tokens = SyntheticTokens(CFG.vocab_size, CFG.seq_len).batch(0, 0, 16)
    loss = model(tokens[:, :-1], tokens[:, 1:], 1.0 / 16).item()
    assert abs(loss - math.log(CFG.vocab_size)) < 0.05
