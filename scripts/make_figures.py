"""Makes the documentation's figures, docs/images/<name>.png, and records in
docs/images/figures.json the digest each was made from: this script's source and the
figure's inputs (the program's output for the simulated timeline and the resharding
plan, the recorded run under docs/images/data/ for the reward curve).
tests/python/test_docs.py recomputes the digests: a figure older than its inputs, or
than this script, fails it.

    /usr/bin/python3 scripts/make_figures.py [--rlsched build/rlsched] [--only NAME]

Figures:
  timeline         one simulated run in sync and in async (staleness 1), engine by engine
                   and the trainer: generation, weight syncs and training steps in time
  reward           the tiny GRPO run's mean reward per step, sync and async (the recorded
                   runs of benchmarks/tiny_grpo_learning.py in docs/images/data/)
  reshard_traffic  the bytes each trainer GPU sends and each engine GPU receives in
                   `rlsched reshard`'s plan for Llama-3.1-70B, TP 4 x PP 2 to TP 8 engines
"""

import argparse
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES = os.path.join(_REPO, "docs", "images")
DIGESTS = os.path.join(IMAGES, "figures.json")

_SIMULATE = ["--engines", "4", "--engine-concurrency", "64", "--trainer-ranks", "8",
             "--prompts-per-step", "32", "--samples-per-prompt", "8", "--steps", "5",
             "--train-seconds-per-step", "120"]
_MODES = {"sync": ["--mode", "sync"],
          "async, staleness 1": ["--mode", "async", "--max-staleness", "1"]}
_RESHARD = ["--model", os.path.join(_REPO, "tests", "data", "configs", "llama-3.1-70b.json"),
            "--train", "tp=4,pp=2,dp=4", "--infer", "tp=8,replicas=4"]
_REWARDS = {"sync": "tiny_grpo_rewards_sync.csv", "async, staleness 1":
            "tiny_grpo_rewards_async.csv"}


def _run_to_file(rlsched, args, flag):
    """The file `rlsched args flag FILE` writes, as bytes."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "out.json")
        subprocess.run([rlsched, *args, flag, path], check=True, capture_output=True)
        with open(path, "rb") as f:
            return f.read()


def inputs(name, rlsched):
    """What figure `name` is drawn from: {label: bytes}."""
    if name == "timeline":
        return {mode: _run_to_file(rlsched, ["simulate", *_SIMULATE, *args], "--trace")
                for mode, args in _MODES.items()}
    if name == "reshard_traffic":
        return {"plan": _run_to_file(rlsched, ["reshard", *_RESHARD], "--plan-out")}
    if name == "reward":
        found = {}
        for mode, file in _REWARDS.items():
            with open(os.path.join(IMAGES, "data", file), "rb") as f:
                found[mode] = f.read()
        return found
    raise ValueError(f"no figure {name!r}")


def digest(name, data):
    """The digest of figure `name` drawn from `data` by this script."""
    h = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(f.read())
    for label in sorted(data):
        h.update(label.encode() + b"\0" + hashlib.sha256(data[label]).digest())
    return h.hexdigest()


def _timeline(data, ax_rows):
    colors = {"generate": "#4c72b0", "sync": "#dd8452", "step": "#55a868",
              "release": "#8172b3", "resume": "#937860"}
    for ax, (mode, trace) in zip(ax_rows, data.items()):
        events = json.loads(trace)["traceEvents"]
        names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "thread_name"}
        rows = sorted({(e["pid"], e["tid"]) for e in events if e["ph"] == "X"})
        labels = [names.get(r, "trainer") for r in rows]
        for e in events:
            if e["ph"] != "X":
                continue
            kind = e["name"].split()[0]
            y = rows.index((e["pid"], e["tid"]))
            ax.broken_barh([(e["ts"] / 1e6, e["dur"] / 1e6)], (y - 0.4, 0.8),
                           facecolors=colors.get(kind, "#999999"), edgecolor="white",
                           linewidth=0.3)
        ax.set_yticks(range(len(rows)), labels)
        ax.set_title(mode, loc="left", fontsize=10)
    ax_rows[-1].set_xlabel("simulated seconds")
    from matplotlib.patches import Patch
    ax_rows[0].legend(handles=[Patch(color=colors[k], label=label) for k, label in
                               (("generate", "generating"), ("sync", "loading weights"),
                                ("step", "training step"))],
                      loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, ncol=3,
                      frameon=False)


def _reward(data, ax):
    for mode, text in data.items():
        rows = list(csv.DictReader(io.StringIO(text.decode())))
        ax.plot([int(r["step"]) for r in rows], [float(r["mean_reward"]) for r in rows],
                label=mode)
    ax.axhline(0.9, color="#999999", linewidth=0.8, linestyle="--")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.legend(fontsize=8)


def _reshard(data, ax):
    plan = json.loads(data["plan"])
    trainers, engines = int(plan["trainer_ranks"]), int(plan["engine_ranks"])
    sent, received = [0] * trainers, [0] * engines
    for t in plan["transfers"]:
        size = int(t["bytes"])
        sent[int(t["src_rank"])] += size
        for d in t["dst_ranks"]:
            received[int(d) - trainers] += size
    gb = 1e9
    ax.bar(range(trainers), [s / gb for s in sent], label="sent by trainer GPU r")
    ax.bar([trainers + 1 + e for e in range(engines)], [r / gb for r in received],
           color="#dd8452", label="received by engine GPU e")
    ax.set_ylabel("GB per sync")
    ax.set_xlabel(f"trainer GPUs 0-{trainers - 1}, then engine GPUs 0-{engines - 1} "
                  f"(one sender would send all {sum(sent) / gb:,.0f} GB)")
    ax.legend(fontsize=8, loc="upper left")


def draw(name, data, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if name == "timeline":
        fig, axes = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True)
        _timeline(data, list(axes))
    else:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        (_reward if name == "reward" else _reshard)(data, ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


NAMES = ("timeline", "reward", "reshard_traffic")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rlsched", default=os.path.join(_REPO, "build", "rlsched"))
    parser.add_argument("--only", choices=NAMES)
    args = parser.parse_args()
    digests = {}
    if os.path.exists(DIGESTS):
        with open(DIGESTS, encoding="utf-8") as f:
            digests = json.load(f)
    for name in [args.only] if args.only else NAMES:
        data = inputs(name, args.rlsched)
        draw(name, data, os.path.join(IMAGES, name + ".png"))
        digests[name] = digest(name, data)
        print(f"{name}: {digests[name][:16]}", file=sys.stderr)
    with open(DIGESTS, "w", encoding="utf-8") as f:
        json.dump(digests, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
