"""selfplay.eval.plots: the evaluation figure is drawn from results dicts, full or nearly empty, as a real PNG."""

from __future__ import annotations

import struct

import matplotlib.pyplot as plt

from generator.schema import Task
from selfplay.eval import evaluate as E
from selfplay.eval.plots import plot_eval

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _generated(i: int) -> Task:
    return Task(
        id=f"t{i}",
        family=f"generator/list_int+{'ab'[i % 2]}",
        source="generator",
        split="train",
        level=1,
        description="d",
        entry_point="f",
        signature="def f(x)",
        reference_solution="def f(x): return x",
        created_step=1 + i // 4,
        fingerprints={"ast": f"h{i % 7}"},
        difficulty=(i % 5) / 4,
    )


def full_results() -> dict:
    split = {"tasks": 3, "pass@1_greedy": 0.67, "pass@1": 0.5, "pass@4": 0.8, "tests_passed": 0.7, "quality": 0.9}
    history = [{"step": s, "validity": v} for s, v in [(1, 0.0), (2, 0.25), (3, None), (4, 0.5)]]
    return {
        "checkpoint": "runs/x/checkpoints/step_4",
        "step": 4,
        "heldout": {"test": split, "deeper": dict(split, **{"pass@1_greedy": 0.0}), "by_family": {}},
        "heldout_over_time": E.evals_over_time({"0": {"test": {"pass@1_greedy": 0.3}}, "4": {"test": split}}),
        "humaneval": {"problems": 5, "pass@1_greedy": 0.2, "pass@1": 0.1, "pass@4": 0.3},
        "generator": {
            "validity": E.validity_over_time(history),
            **E.generated_task_stats([_generated(i) for i in range(20)]),
            "snapshot": {"tasks": 4, "pass@1_greedy": 0.25, "pass@1": 0.2, "pass@4": 0.5},
        },
    }


def test_plot_of_full_results_is_a_png(tmp_path):
    out = plot_eval(full_results(), tmp_path / "sub" / "step_4.png")
    width, height = png_size(out)
    assert (width, height) == (16 * 90, 9 * 90)  # figsize x dpi
    assert out.stat().st_size > 20_000  # six drawn panels, not a blank canvas
    assert plt.get_fignums() == []  # the figure is closed (no leak across many evaluations)


def test_plot_without_data_draws_placeholder_panels(tmp_path):
    # a warm-start checkpoint evaluated on HumanEval only: no held-out, no history, no generator tasks
    results = {
        "checkpoint": "c",
        "step": 0,
        "humaneval": {"problems": 2, "pass@1_greedy": 0.0},
        "heldout_over_time": {},
        "generator": {"validity": E.validity_over_time([]), **E.generated_task_stats([]), "snapshot": {"tasks": 0}},
    }
    assert png_size(plot_eval(results, tmp_path / "a.png"))[0] > 0
    assert png_size(plot_eval({}, tmp_path / "b.png"))[0] > 0


def test_a_heldout_evaluation_draws_its_own_panels_only(tmp_path):
    """`--suite heldout`: the held-out panels (this checkpoint, the run's evaluations), not four empty ones."""
    full = full_results()
    results = {k: full[k] for k in ("checkpoint", "step", "heldout", "heldout_over_time")}
    width, height = png_size(plot_eval(results, tmp_path / "heldout.png"))
    assert (width, height) == (int(16 * 2 / 3 * 90), int(4.5 * 90))  # two panels side by side
    humaneval_only = {"checkpoint": "c", "step": 0, "humaneval": {"problems": 2, "pass@1_greedy": 0.5}}
    assert png_size(plot_eval(humaneval_only, tmp_path / "h.png")) == (int(16 / 3 * 90), int(4.5 * 90))
