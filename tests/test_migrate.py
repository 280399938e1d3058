"""Migration plans against hand computation (AutoHet sec. IV: layer-wise shards, TP split / merge,
local first, remote only for what no surviving node holds).

The model is a small Llama-style decoder (no biases, RMSNorm, SwiGLU, no position table) so the
parameter counts can be written out by hand, h = 64, ffn = 128, V = 256, 4 blocks, 6 units:
  embedding (unit 0): sharded V h = 256 x 64 = 16384, replicated 0
  block (units 1-4):  sharded QKV h (h + 2 kv) = 64 x 192 = 12288, out-proj h h = 4096,
                      MLP 3 h f = 3 x 64 x 128 = 24576  -> 40960;  replicated 2 norms x h = 128
  head (unit 5):      sharded V h = 16384, replicated final norm h = 64
Checkpointed bytes per parameter, fp16 + Adam (ZeRO paper sec. 3.1): 2 (fp16 weight) + 12 (fp32
master, momentum, variance) = 14; gradients are not checkpointed.
"""
from __future__ import annotations

from fractions import Fraction

import pytest

from hetplan.cluster_state import ClusterState, NodeFailure
from hetplan.errors import PlanError
from hetplan.instance import instance_from_dict
from hetplan.plan import plan_from_dict
from hetplan.runtime.pieces import moved_ranks
from hetplan.runtime.migrate import MigrationOptions, checkpoint_layout, migration_plan

B = 14  # bytes per checkpointed parameter
S_E = 16384 * B  # embedding, sharded part
S_B = 40960 * B  # one block, sharded part
R_B = 128 * B  # one block, replicated part
S_H = 16384 * B  # head, sharded part (untied)
R_H = 64 * B  # head, replicated part
S_ALL = S_E + 4 * S_B + S_H  # sharded bytes of the whole model
R_ALL = 4 * R_B + R_H  # replicated bytes of the whole model
NET_GBPS = 10.0


def inst(tied: bool = False):
    return instance_from_dict({
        "name": "mig",
        "cluster": {"node_groups": [{"name": "a", "gpu_type": "A100-80", "gpus_per_node": 4, "count": 3,
                                     "zone": "r1-a", "price_per_gpu_hour_usd": 3.0}],
                    "network": {"inter_node": {"kind": "ethernet", "bandwidth_GBps": NET_GBPS, "latency_s": 0.0}}},
        "workload": {"model": {"arch": {"family": "llama", "num_layers": 4, "hidden_size": 64, "num_heads": 4,
                                        "ffn_hidden_size": 128, "vocab_size": 256, "seq_len": 16, "mlp": "swiglu",
                                        "tied_embeddings": tied}},
                     "global_batch_size": 4, "precision": "fp16", "optimizer": "adam"}})


def rep(node: str, gpus: tuple[int, ...], share: int = 4) -> dict:
    return {"gpu_type": "A100-80", "tp": len(gpus), "node": node, "gpus": list(gpus), "microbatch_share": share}


def plan(stages) -> object:
    return plan_from_dict({"num_microbatches": 1, "stages": [
        {"layer_start": a, "layer_end": b, "replicas": reps} for a, b, reps in stages]})


def by_rank(mp):
    return {r.rank: r.bytes_by_source() for r in mp.ranks}


def test_tp2_to_tp4_split():
    """One replica, TP 2 on a-0 GPUs 0-1 -> TP 4 on GPUs 0-3. New TP rank r needs [r/4, (r+1)/4).
    rank 0: a slice of what GPU 0 holds ([0, 1/2)): nothing moves;
    rank 1: [1/4, 1/2) lies in GPU 0's shard -> local; its replicated tensors are on its own GPU;
    ranks 2, 3: [1/2, 3/4), [3/4, 1) lie in GPU 1's shard -> local, replicated too (held nowhere on
    their GPUs). The node reads the replicated tensors once for GPUs 2 and 3."""
    i = inst()
    old = plan([(0, 6, [rep("a-0", (0, 1))])])
    new = plan([(0, 6, [rep("a-0", (0, 1, 2, 3))])])
    mp = migration_plan(i, old, new)
    per = by_rank(mp)
    assert per[0] == {"gpu": S_ALL / 4 + R_ALL, "local": 0, "peer": 0, "remote": 0}
    assert per[1] == {"gpu": R_ALL, "local": S_ALL / 4, "peer": 0, "remote": 0}
    assert per[2] == per[3] == {"gpu": 0, "local": S_ALL / 4 + R_ALL, "peer": 0, "remote": 0}
    assert mp.bytes_by_source == {"gpu": S_ALL / 4 + 2 * R_ALL, "local": 3 * S_ALL / 4 + R_ALL, "peer": 0, "remote": 0}
    assert all(op == "split" for r in mp.ranks for op in r.ops.values())
    # the sources: rank 1 reads from GPU 0's shard [0, 1/2), ranks 2-3 from GPU 1's [1/2, 1)
    src = {(f.rank, f.source_gpu, f.source_lo, f.source_hi) for r in mp.ranks for f in r.fetches if f.part == "sharded"}
    assert (1, 0, Fraction(0), Fraction(1, 2)) in src and (3, 1, Fraction(1, 2), Fraction(1)) in src
    assert mp.recovery_s == pytest.approx((3 * S_ALL / 4 + R_ALL) / 3.5e9)
    assert mp.moved_ranks == 3 == moved_ranks(i, old, new)
    # remote-only: node a-0 downloads the whole model once: S_ALL + R_ALL at 1.2 GB/s
    assert mp.remote_only_s == pytest.approx((S_ALL + R_ALL) / 1.2e9)


def test_tp2_to_tp1_merge():
    """TP 2 on a-0 GPUs 0-1 -> one TP 1 rank on GPU 0: [0, 1/2) is on its GPU, [1/2, 1) is read from
    GPU 1's host copy and concatenated (merge)."""
    i = inst()
    old = plan([(0, 6, [rep("a-0", (0, 1))])])
    new = plan([(0, 6, [rep("a-0", (0,))])])
    mp = migration_plan(i, old, new)
    assert by_rank(mp)[0] == {"gpu": S_ALL / 2 + R_ALL, "local": S_ALL / 2, "peer": 0, "remote": 0}
    assert set(mp.ranks[0].ops.values()) == {"merge"}
    pieces = sorted((f.unit, f.lo, f.hi, f.source) for f in mp.ranks[0].fetches if f.part == "sharded" and f.unit == 2)
    assert pieces == [(2, Fraction(0), Fraction(1, 2), "gpu"), (2, Fraction(1, 2), Fraction(1), "local")]


def test_stage_boundary_shift_fetches_one_unit_from_the_peer():
    """Stages [0,3) on a-0 and [3,6) on a-1 -> [0,4) and [4,6): only block 3 moves, a-1 -> a-0."""
    i = inst()
    old = plan([(0, 3, [rep("a-0", (0,))]), (3, 6, [rep("a-1", (0,))])])
    new = plan([(0, 4, [rep("a-0", (0,))]), (4, 6, [rep("a-1", (0,))])])
    mp = migration_plan(i, old, new)
    per = by_rank(mp)
    assert per[0] == {"gpu": S_E + 2 * (S_B + R_B), "local": 0, "peer": S_B + R_B, "remote": 0}
    assert per[1] == {"gpu": S_B + R_B + S_H + R_H, "local": 0, "peer": 0, "remote": 0}
    assert mp.ranks[0].ops == {0: "keep", 1: "keep", 2: "keep", 3: "copy"}
    assert {f.source_node for f in mp.ranks[0].fetches if f.source == "peer"} == {"a-1"}
    assert mp.recovery_s == pytest.approx((S_B + R_B) / (NET_GBPS * 1e9))
    # remote only: a-0 needs units 0-3, a-1 units 4-5, each from storage at 1.2 GB/s
    a0, a1 = S_E + 3 * (S_B + R_B), S_B + R_B + S_H + R_H
    assert mp.remote_only_bytes == pytest.approx(a0 + a1)
    assert mp.remote_only_s == pytest.approx(max(a0, a1) / 1.2e9)
    assert mp.moved_ranks == 1 == moved_ranks(i, old, new)


def test_lost_node_forces_remote_fetch():
    """a-1 (stage [3,6)) fails; the new single-stage plan on a-0 needs units 3-5, which no surviving
    GPU holds: they come from the checkpoint files unit_0003..0005/tp0of1.pt in remote storage."""
    i = inst()
    old = plan([(0, 3, [rep("a-0", (0,))]), (3, 6, [rep("a-1", (0,))])])
    new = plan([(0, 6, [rep("a-0", (0,))])])
    state = ClusterState.initial(i).apply(NodeFailure(time_s=1, node="a-1"))
    mp = migration_plan(i, old, new, state)
    remote = 2 * (S_B + R_B) + S_H + R_H
    assert by_rank(mp)[0] == {"gpu": S_E + 2 * (S_B + R_B), "local": 0, "peer": 0, "remote": remote}
    files = {f.file for f in mp.ranks[0].fetches if f.source == "remote"}
    assert files == {"unit_0003/tp0of1.pt", "unit_0004/tp0of1.pt", "unit_0005/tp0of1.pt"}
    assert mp.recovery_s == pytest.approx(remote / 1.2e9)
    opts = MigrationOptions(remote_GBps_per_node=2.0)
    assert migration_plan(i, old, new, state, options=opts).recovery_s == pytest.approx(remote / 2e9)
    # the same change with a surviving DP replica of the lost stage on a-2: peer instead of remote
    old2 = plan([(0, 3, [rep("a-0", (0,), 2), rep("a-0", (1,), 2)]),
                 (3, 6, [rep("a-1", (0,), 2), rep("a-2", (0,), 2)])])
    new2 = plan([(0, 6, [rep("a-0", (0,))])])
    mp2 = migration_plan(i, old2, new2, state)
    assert by_rank(mp2)[0] == {"gpu": S_E + 2 * (S_B + R_B), "local": 0, "peer": remote, "remote": 0}
    assert {f.source_node for f in mp2.ranks[0].fetches if f.source == "peer"} == {"a-2"}


def test_lost_tp2_stage_is_merged_from_remote_shards():
    """Stage [3,6) ran TP 2 on a-1; a-1 fails; the TP 1 rank on a-0 reads both shard files of each
    unit (merge) and the replicated tensors once."""
    i = inst()
    old = plan([(0, 3, [rep("a-0", (0,))]), (3, 6, [rep("a-1", (0, 1))])])
    new = plan([(0, 6, [rep("a-0", (0,))])])
    state = ClusterState.initial(i).apply(NodeFailure(time_s=1, node="a-1"))
    mp = migration_plan(i, old, new, state)
    assert by_rank(mp)[0]["remote"] == 2 * (S_B + R_B) + S_H + R_H
    assert {u: op for u, op in mp.ranks[0].ops.items() if u >= 3} == {3: "merge", 4: "merge", 5: "merge"}
    files = sorted({f.file for f in mp.ranks[0].fetches if f.source == "remote" and f.unit == 4})
    assert files == ["unit_0004/tp0of2.pt", "unit_0004/tp1of2.pt"]


def test_dp_replicas_on_one_node_fetch_once():
    """Two TP 1 replicas of the whole model move from a-1 to a-2: each rank needs everything from
    the peer, the node receives it once."""
    i = inst()
    old = plan([(0, 6, [rep("a-1", (0,), 2), rep("a-1", (1,), 2)])])
    new = plan([(0, 6, [rep("a-2", (0,), 2), rep("a-2", (1,), 2)])])
    mp = migration_plan(i, old, new)
    assert by_rank(mp)[0]["peer"] == by_rank(mp)[1]["peer"] == S_ALL + R_ALL
    assert mp.bytes_by_source["peer"] == S_ALL + R_ALL
    assert mp.recovery_s == pytest.approx((S_ALL + R_ALL) / (NET_GBPS * 1e9))


def test_tied_head_takes_its_matrix_from_the_embedding():
    """Tied embeddings: the head's V x h matrix is unit 0's. Collapsing [0,3) on a-0 and [3,6) on
    a-1 onto a-0 moves blocks 3-4 and the head's norm from a-1, not the head matrix (on a-0 GPU 0)."""
    i = inst(tied=True)
    old = plan([(0, 3, [rep("a-0", (0,))]), (3, 6, [rep("a-1", (0,))])])
    new = plan([(0, 6, [rep("a-0", (0,))])])
    mp = migration_plan(i, old, new)
    assert by_rank(mp)[0]["peer"] == 2 * (S_B + R_B) + R_H
    # the layout: unit 5's files hold only the norm, the matrix is saved with unit 0
    layout = {(f.unit, f.tp_rank): f.nbytes for f in checkpoint_layout(i, old)}
    assert layout[(5, 0)] == R_H and layout[(0, 0)] == S_E


def test_fresh_start_reads_everything_from_remote():
    i = inst()
    new = plan([(0, 3, [rep("a-0", (0,))]), (3, 6, [rep("a-1", (0,))])])
    mp = migration_plan(i, None, new)
    assert mp.bytes_by_source["remote"] == S_ALL + R_ALL
    assert mp.recovery_s == pytest.approx(mp.remote_only_s)


def test_bad_options_are_refused():
    with pytest.raises(PlanError, match="local_GBps"):
        MigrationOptions(local_GBps=0)


@pytest.mark.parametrize("zone_GBps, source", [(5.0, "peer"), (0.5, "remote")])
def test_a_slow_peer_link_loses_to_remote_storage(zone_GBps, source):
    """The whole model moves from zone a to zone b. Over a 5 GB/s inter-zone link the peer is
    faster than storage (1.2 GB/s); over 0.5 GB/s storage wins: (S_ALL + R_ALL) / 1.2 GB/s."""
    data = inst().model_dump(mode="json", exclude={"base_dir"})
    data["cluster"]["node_groups"].append({"name": "b", "gpu_type": "A100-80", "gpus_per_node": 4, "count": 1,
                                           "zone": "r1-b", "price_per_gpu_hour_usd": 3.0})
    data["cluster"]["network"]["inter_zone"] = {"kind": "ethernet", "bandwidth_GBps": zone_GBps, "latency_s": 0.0}
    from hetplan.instance import instance_from_dict as load

    i = load(data)
    old = plan([(0, 6, [rep("a-0", (0,))])])
    new = plan([(0, 6, [rep("b-0", (0,))])])
    mp = migration_plan(i, old, new)
    assert mp.bytes_by_source[source] == S_ALL + R_ALL
    rate = zone_GBps if source == "peer" else 1.2
    assert mp.recovery_s == pytest.approx((S_ALL + R_ALL) / (rate * 1e9))
