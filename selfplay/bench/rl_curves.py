"""Learning curves of two runs side by side (TensorBoard scalars of RUN_DIR/tb): the RL core before and after a
change, same config and seed. Draws the solver's pass rate, reward, KL to the reference, entropy, policy loss and
gradient norm over the iterations, and prints each series' mean over the run.

    python -m selfplay.bench.rl_curves --runs before=RUN_A after=RUN_B --out lab/rl_curves.png
"""

from __future__ import annotations

import argparse
import statistics

from selfplay.runtime.tb import read_scalars

PANELS = [
    ("solver/pass_rate", "solver pass rate (training batch)"),
    ("solver/reward_mean", "solver reward"),
    ("ppo/solver/kl", "KL to the reference, per token"),
    ("ppo/solver/entropy", "entropy, per token"),
    ("ppo/solver/policy_loss", "policy loss"),
    ("ppo/solver/grad_norm", "gradient norm (before clipping)"),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, help="LABEL=RUN_DIR, in drawing order")
    p.add_argument("--out", required=True)
    p.add_argument("--title", default="")
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {label: read_scalars(path) for label, path in (r.split("=", 1) for r in a.runs)}
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (tag, title) in zip(axes.flat, PANELS):
        for label, scalars in runs.items():
            points = scalars.get(tag, [])
            if points:
                ax.plot([s for s, _ in points], [v for _, v in points], marker=".", label=label)
                print(f"{label:>8} {tag:<26} mean {statistics.mean(v for _, v in points):+.4f} over {len(points)}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    if a.title:
        fig.suptitle(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
