"""The reward curves of tiny GRPO runs as a PNG: mean reward against the train step and
against wall time, one line per run.

    python3 examples/tiny_grpo/plot.py --out reward.png RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a run.py output directory (its ``rewards.csv``: the mean reward of
each step's trained samples and the trainer's wall seconds when the step ended; its
``summary.json`` names the mode). Needs matplotlib (Debian's ``python3-matplotlib``);
without it, :func:`plot` says so and writes nothing (exit status 0: the plot is
optional).
"""

import argparse
import csv
import json
import os
import sys
from typing import List, Optional, Sequence


def read_curve(run_dir: str) -> dict:
    """A run's label and its per-step (step, mean reward, wall seconds)."""
    steps, rewards, walls = [], [], []
    with open(os.path.join(run_dir, "rewards.csv")) as f:
        for row in csv.DictReader(f):
            steps.append(int(row["step"]))
            rewards.append(float(row["mean_reward"]))
            walls.append(float(row["wall_seconds"]))
    label = os.path.basename(os.path.normpath(run_dir))
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            s = json.load(f)
        label = s["mode"]
        if s["mode"] == "async":
            label += f" s={s['max_staleness']}" + (" partial" if s["partial_rollout"] else "")
        if s.get("killed"):
            label += f" ({s['killed']['engine']} killed)"
    except (OSError, ValueError, KeyError):
        pass
    return {"label": label, "steps": steps, "rewards": rewards, "walls": walls}


def plot(run_dirs: Sequence[str], out: str, target: Optional[float] = None,
         title: str = "tiny GRPO: reverse a digit string") -> bool:
    """Writes the PNG; False (and a message on stderr) when matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: matplotlib is not installed (Debian: apt-get install "
              "python3-matplotlib); no PNG written", file=sys.stderr)
        return False
    curves = [read_curve(d) for d in run_dirs]
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for c in curves:
        by_step.plot(c["steps"], c["rewards"], label=c["label"], linewidth=1.2)
        by_time.plot(c["walls"], c["rewards"], label=c["label"], linewidth=1.2)
    for ax, xlabel in ((by_step, "train step"), (by_time, "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    by_step.set_ylabel("mean reward of the step's samples")
    by_step.set_ylim(0, 1.02)
    by_time.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run.py output directories")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--target", type=float, default=None,
                        help="draw the reward target as a dashed line")
    args = parser.parse_args(argv)
    plot(args.runs, args.out, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
