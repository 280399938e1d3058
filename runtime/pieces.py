"""What model state each rank of a placed plan holds, in pieces (unit, part, fraction of the TP
shards), and how many ranks of a new plan must fetch state they do not hold: the measure of a
change of plan that the re-planner scores (`hetplan.orchestration.replan`) and the migration
(`runtime/migrate.py`) executes."""
from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Iterable

from hetplan.catalog import ModelArch
from hetplan.cluster_state import ClusterState
from hetplan.estimators.model_stats import unit_params
from hetplan.instance import Instance
from hetplan.plan import Plan, workers


# A piece of model state: (content unit, part, lo, hi). `part` "sharded" is the fraction [lo, hi) of
# the unit's TP-sharded tensors (a TP rank r of t holds [r/t, (r+1)/t)); "replicated" is the unit's
# replicated tensors (norms, row-parallel biases, positions), [0, 1). The LM head of a model with
# tied embeddings shares its sharded matrix with the embedding: its content unit is 0.
Piece = tuple[int, str, Fraction, Fraction]


def content_unit(arch: ModelArch, unit: int) -> int:
    return 0 if (arch.tied_embeddings and unit == arch.num_units - 1) else unit


@lru_cache(maxsize=65536)
def rank_pieces(arch: ModelArch, layer_start: int, layer_end: int, tp: int, tp_rank: int) -> frozenset[Piece]:
    """The state a rank of TP degree `tp` holding units [layer_start, layer_end) keeps."""
    lo, hi = Fraction(tp_rank, tp), Fraction(tp_rank + 1, tp)
    out = set()
    for u in range(layer_start, layer_end):
        p = unit_params(arch, u)
        if p.sharded:
            out.add((content_unit(arch, u), "sharded", lo, hi))
        if p.replicated:
            out.add((u, "replicated", Fraction(0), Fraction(1)))
    return frozenset(out)


def covered(piece: Piece, held: Iterable[Piece]) -> bool:
    c, part, lo, hi = piece
    return any(h[0] == c and h[1] == part and h[2] <= lo and hi <= h[3] for h in held)


@lru_cache(maxsize=65536)
def holds_all(need: frozenset[Piece], have: frozenset[Piece]) -> bool:
    """Whether `have` covers every piece of `need`. Memoised: the placement asks it for every
    (rank, GPU) pair it weighs, with the same few sets (`rank_pieces` returns shared frozensets,
    which keep their hash), and the Fraction comparisons of `covered` are slow."""
    return all(covered(p, have) for p in need)


def holdings(instance: Instance, plan: Plan) -> dict[tuple[str, int], frozenset[Piece]]:
    """(node, local GPU) -> pieces its rank holds, for a placed plan."""
    arch = instance.model_arch
    out = {}
    for w in workers(instance, plan):
        st, rep = plan.stages[w.stage], plan.stages[w.stage].replicas[w.replica]
        out[(w.node_id, w.local_gpu)] = rank_pieces(arch, st.layer_start, st.layer_end, rep.tp, w.tp_rank)
    return out


def moved_ranks(instance: Instance, old_plan: Plan | None, new_plan: Plan, state: ClusterState | None = None,
                lost_gpus: Iterable[tuple[str, int]] = ()) -> int:
    """Ranks of `new_plan` whose GPU does not already hold all they need (both plans placed).
    GPUs down in `state` or listed in `lost_gpus` have lost what they held."""
    if old_plan is None:
        return new_plan.num_gpus
    held = holdings(instance, old_plan)
    lost = set(lost_gpus)
    if state is not None:
        lost |= {g for g in held if state.gpus_up.get(g[0], 0) <= g[1]}
    arch = instance.model_arch
    count = 0
    for w in workers(instance, new_plan):
        st, rep = new_plan.stages[w.stage], new_plan.stages[w.stage].replicas[w.replica]
        have = frozenset() if (w.node_id, w.local_gpu) in lost else held.get((w.node_id, w.local_gpu), frozenset())
        need = rank_pieces(arch, st.layer_start, st.layer_end, rep.tp, w.tp_rank)
        if not holds_all(need, have):
            count += 1
    return count
