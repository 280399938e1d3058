"""The iteration's composition is stated once (formulations/joint/composition.py): hand-computed
values of its functions, and no other module of the joint formulation or the planner writes the
pipeline's (m - 1) x bottleneck term itself."""
import ast
from pathlib import Path

import pytest

from hetplan.formulations import joint

REPO = Path(__file__).resolve().parent.parent
HOME = REPO / "formulations" / "joint" / "composition.py"


def m_minus_one(tree: ast.AST) -> list[int]:
    """Lines of `m - 1` or `<x>.m - 1` expressions."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
            and isinstance(node.right, ast.Constant) and node.right.value == 1
            and ((isinstance(node.left, ast.Name) and node.left.id == "m")
                 or (isinstance(node.left, ast.Attribute) and node.left.attr == "m"))]


def test_the_pipeline_term_is_written_only_in_the_composition():
    files = sorted((REPO / "formulations" / "joint").glob("*.py")) + sorted(
        (REPO / "orchestration" / "planner").glob("*.py"))
    found = {f"{path.relative_to(REPO)}:{line}" for path in files if path != HOME
             for line in m_minus_one(ast.parse(path.read_text()))}
    assert not found, f"compose T with joint.iteration_time_s instead: {sorted(found)}"
    assert m_minus_one(ast.parse(HOME.read_text()))  # the check sees the one place it is written
    assert m_minus_one(ast.parse("t = f + (inp.m - 1) * theta"))


def test_hand_computed_values():
    assert joint.iteration_time_s(4, 1.0, 0.5, 2.0, 0.25) == pytest.approx(1.0 + 0.5 + 3 * 2.0 + 0.25)
    assert joint.iteration_time_s(1, 1.0, 0.5, 99.0, 0.25) == pytest.approx(1.75)  # one microbatch: no steady state
    T = joint.iteration_time_s(9, 0.3, 0.1, 0.05, 0.2)
    assert joint.theta_for_time_s(9, T, 0.3, 0.1, 0.2) == pytest.approx(0.05)
    assert joint.iteration_cost_usd(0.01, 2.0, 0.5) == pytest.approx(0.52)
    assert joint.worker_bytes(10.0, 2.0, 3) == 16.0
    # Sailor's sends: the first stage sends its activation twice when P > 3, the last its gradient twice
    assert joint.sailor_p2p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == [2.0, 2.0 + 4.0, 3.0 + 5.0, 12.0]
    assert joint.sailor_p2p([1.0], [4.0]) == [1.0, 8.0]


def _boundary_inputs(tps: tuple[int, ...] = (1, 2), inter: bool = True) -> joint.JointInputs:
    """Pools of A100 (TPs `tps`, in that order) and V100 (TP 1) in one zone, on 4-GPU nodes; links
    with no latency, so a boundary's time is 2 x bytes / bandwidth."""
    pools = tuple(joint.Pool("A100", "z", "r", t, 8, 1.0, node_gpus=4) for t in tps) + (
        joint.Pool("V100", "z", "r", 1, 8, 1.0, node_gpus=4),)
    link = lambda gbps: joint.LinkCost(gbps * 1e9, 0.0)  # noqa: E731
    empty = ((),) * len(pools)
    return joint.JointInputs(
        P=2, D=2, b=1, m=4, pools=pools, step_s=empty, upd_s=empty, stat_bytes=empty, act_bytes=empty,
        cap_bytes=(1.0,) * len(pools), grad_bytes=(), tied_grad_bytes=0.0, boundary_bytes=1e9, node=link(100),
        zone=link(5), region=link(1), egress_zone_usd_per_GB=0.0, egress_region_usd_per_GB=0.0,
        inter=link(10) if inter else None)


def test_boundary_steps_and_when_a_pair_is_surely_on_two_nodes():
    inp = _boundary_inputs()
    assert [joint.boundary_s(inp, *d) for d in ((0, 0, 0), (1, 0, 0), (1, 1, 0), (1, 1, 1))] == pytest.approx(
        [0.02, 0.2, 0.4, 2.0])  # 2 x 1 GB over 100, 10, 5 and 1 GB/s
    apart = joint.composition.apart
    assert apart(inp, (2, 0, 0), (2, 0, 0)) == 0  # four TP 1 replicas fit one 4-GPU node
    assert apart(inp, (2, 0, 0), (0, 2, 0)) == 1  # first fit: 2 + 4 GPUs on one node
    assert apart(inp, (0, 2, 0), (2, 0, 0)) == 0  # a TP 2 before TP 1: first fit may pair them on nodes
    assert apart(inp, (1, 0, 0), (0, 0, 1)) == 1  # another GPU type: another node
    four = _boundary_inputs((1, 4))
    assert apart(four, (0, 1, 0), (1, 0, 0)) == 1  # a TP 4 replica fills its node
    # pools out of first fit's order (TP 2 listed before TP 1): its rule is off, the physical one holds
    assert apart(_boundary_inputs((2, 1)), (0, 2, 0), (2, 0, 0)) == 0  # TP 1 x 2, then TP 2 x 2
    assert apart(_boundary_inputs(inter=False), (1, 0, 0), (0, 0, 1)) == 0  # no c_inter: c_node for all
