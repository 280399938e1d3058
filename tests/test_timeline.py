"""The PNG plots: the timeline's legend sits outside the axes (it used to cover the end of stage 0),
the throughput-cost front, and both files are written whole or not at all."""
from __future__ import annotations

from pathlib import Path

import pytest

from hetplan.errors import HetplanError, PlanError
from hetplan.instance import load_instance
from hetplan.plan import load_plan
from hetplan.simulator import simulate
from hetplan.simulator.timeline import pareto_figure, pipeline_events, plot_pareto, plot_timeline, timeline_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FRONT = [
    {"budget_usd": 0.0021, "cost_usd": 0.0021, "iters_per_s": 0.9, "samples_per_s": 57.6, "gpus": 6, "gap": 0.0},
    {"budget_usd": 0.0030, "cost_usd": 0.0030, "iters_per_s": 1.3, "samples_per_s": 83.2, "gpus": 10, "gap": 0.01},
    {"budget_usd": 0.0040, "cost_usd": 0.0030, "iters_per_s": 1.3, "samples_per_s": 83.2, "gpus": 10, "gap": 0.01},
    {"budget_usd": 0.0045, "cost_usd": 0.0045, "iters_per_s": 1.6, "samples_per_s": 102.4, "gpus": 16, "gap": 0.0},
]


def report(name: str):
    return simulate(load_instance(name), load_plan(name))


def legend_clear_of_axes(fig) -> None:
    fig.canvas.draw()
    (ax,) = fig.axes
    legend = ax.get_legend()
    assert legend is not None
    renderer = fig.canvas.get_renderer()
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


@pytest.mark.parametrize("name", ["a100_v100_one_zone", "zorse_4type_2region"])
def test_timeline_legend_is_outside_the_axes(name):
    rep = report(name)
    fig = timeline_figure(rep)
    legend_clear_of_axes(fig)
    # the bars end with the update, the right end of the data the legend used to cover
    end = max(e.end_s for e in pipeline_events(rep))
    assert fig.axes[0].get_xlim()[1] >= end


def test_plot_timeline_writes_a_png_atomically(tmp_path: Path):
    path = tmp_path / "timeline.png"
    path.write_bytes(b"old")
    plot_timeline(report("a100_v100_one_zone"), path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.png"]  # no temporary file left


def test_pareto_plot(tmp_path: Path):
    fig = pareto_figure(FRONT)
    legend_clear_of_axes(fig)
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("cost") and ax.get_ylabel().startswith("throughput")
    # two budgets gave the same plan: one point, one label
    assert sorted(t.get_text() for t in ax.texts) == ["10 GPUs", "16 GPUs", "6 GPUs"]
    path = tmp_path / "front.png"
    plot_pareto(FRONT, path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_pareto_plot_refuses_bad_fronts_and_keeps_the_old_file(tmp_path: Path):
    path = tmp_path / "front.png"
    path.write_bytes(b"old")
    with pytest.raises(PlanError, match="front: no plans to plot"):
        plot_pareto([], path)
    with pytest.raises(PlanError, match=r"front\[1\]\.cost_usd: expected a finite number, got inf"):
        plot_pareto([FRONT[0], {**FRONT[1], "cost_usd": float("inf")}], path)
    with pytest.raises(PlanError, match=r"front\[0\]: missing keys \['gpus'\]"):
        plot_pareto([{k: v for k, v in FRONT[0].items() if k != "gpus"}], path)
    assert path.read_bytes() == b"old"


def test_plot_into_a_missing_directory_is_one_error(tmp_path: Path):
    with pytest.raises(HetplanError, match="does not exist"):
        plot_pareto(FRONT, tmp_path / "nope" / "front.png")
