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
