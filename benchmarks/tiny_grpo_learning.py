"""The tiny GRPO run's full learning runs, per mode, and how long each takes to learn.

Usage (from the repository root, with Debian's python3-torch and the project built):

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/tiny_grpo_learning.py \\
        [--modes sync,async] [--trainer-tp 1,2] [--trainer-dp 1,2] [--steps 60] \\
        [--kill-engine-at STEP] [--kill-engine-during-sync VERSION] \\
        [--out DIR] [--rlsched build/rlsched] [-- run.py options...]

Runs ``examples/tiny_grpo/run.py`` (``rlsched run``, 2 engine processes, a trainer,
the weights through rlsched's executor over gloo by the runtime's weight-sync plans)
once per mode: ``sync``, ``one_step_off``, ``async`` (max staleness 1, partial
rollout), ``async_kill`` (the same with the last engine SIGKILLed mid-generation at
--kill-engine-at), ``async_die`` (the same with the last engine SIGKILLing itself during
the weight sync of version --kill-engine-during-sync, run.py's option: the runtime
replans that sync for the other), ``sync_kill`` and ``sync_die`` (the same in sync
mode), each with run.py's learning defaults unless options after ``--`` say otherwise,
and once per trainer TP size of --trainer-tp and DP size of --trainer-dp (run.py's
--trainer-tp and --trainer-dp; default: run.py's defaults). For each it prints the
reward at the start (mean of the first 3 steps), the
first step at which the mean reward of the last 3 steps reached --target (0.9 of the
task's maximum 1.0) and the trainer's wall seconds then, the final reward (mean of the
last 5 steps), the run's wall time and samples/s, the weight-sync plans the runtime
made and each engine's syncs (count, median and largest seconds), the trainer's seconds
in training (the sum over its calls, the weight sync's hand-off included), the load
average before and after the run, and whether run.py's checks held. Writes DIR/<mode>/
(DIR/<mode>_tp<T>/, DIR/<mode>_dp<D>/ or DIR/<mode>_tp<T>_dp<D>/ with --trainer-tp and
--trainer-dp; run.py's output) and DIR/reward.png (every mode's
curve against step and against wall time; skipped with a message when matplotlib is
absent). Exit status 1 when a run fails its checks or a mode does not reach the target.
"""

import argparse
import json
import os
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLE = os.path.join(_REPO, "examples", "tiny_grpo")

MODES = {
    "sync": ["--mode", "sync"],
    "one_step_off": ["--mode", "one_step_off"],
    "async": ["--mode", "async", "--max-staleness", "1", "--partial-rollout"],
    "async_kill": ["--mode", "async", "--max-staleness", "1", "--partial-rollout"],
    "sync_kill": ["--mode", "sync"],
    "async_die": ["--mode", "async", "--max-staleness", "1", "--partial-rollout"],
    "sync_die": ["--mode", "sync"],
}


def reached(curve, target, window=3):
    """The first step whose trailing `window`-step mean reward is at least `target`."""
    for i in range(window - 1, len(curve)):
        if sum(curve[i - window + 1:i + 1]) / window >= target:
            return i
    return None


def split_passthrough(argv):
    """(this script's arguments, those after ``--`` for run.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    return argv[:argv.index("--")], argv[argv.index("--") + 1:]


def main(argv=None) -> int:
    argv, extra = split_passthrough(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="sync,async",
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--kill-engine-at", type=int, default=10,
                        help="the step of the *_kill modes' SIGKILL")
    parser.add_argument("--kill-engine-during-sync", type=int, default=1, metavar="VERSION",
                        help="the version of the *_die modes' sync")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--trainer-tp", default=None,
                        help="comma-separated trainer TP sizes, each mode run once per size "
                        "(default: run.py's default, once)")
    parser.add_argument("--trainer-dp", default=None,
                        help="comma-separated trainer DP sizes, likewise")
    parser.add_argument("--out", default="/tmp/tiny-grpo-learning")
    parser.add_argument("--rlsched", default=os.environ.get("RLSCHED_BIN")
                        or os.path.join(_REPO, "build", "rlsched"))
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            parser.error(f"--modes: unknown mode {m!r} (of {', '.join(MODES)})")
    def sizes(option, text):
        if not text:
            return [None]
        try:
            values = [int(t) for t in text.split(",") if t]
        except ValueError:
            parser.error(f"{option}: integers separated by commas, got {text!r}")
        if not values or min(values) < 1:
            parser.error(f"{option}: sizes >= 1, got {text!r}")
        return values

    tps = sizes("--trainer-tp", args.trainer_tp)
    dps = sizes("--trainer-dp", args.trainer_dp)
    os.makedirs(args.out, exist_ok=True)
    rows, failed = [], False
    for m, tp, dp in [(m, tp, dp) for m in modes for tp in tps for dp in dps]:
        name = m + ("" if tp is None else f"_tp{tp}") + ("" if dp is None else f"_dp{dp}")
        out = os.path.join(args.out, name)
        kill = (["--kill-engine-at", str(args.kill_engine_at)] if m.endswith("_kill") else
                ["--kill-engine-during-sync", str(args.kill_engine_during_sync)]
                if m.endswith("_die") else [])
        command = [sys.executable, os.path.join(_EXAMPLE, "run.py"), "--rlsched-bin",
                   args.rlsched, "--out", out, "--steps", str(args.steps), *MODES[m], *kill,
                   *(["--trainer-tp", str(tp)] if tp is not None else []),
                   *(["--trainer-dp", str(dp)] if dp is not None else []), *extra]
        load_before = os.getloadavg()
        start = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True)
        wall = time.monotonic() - start
        try:
            with open(os.path.join(out, "summary.json")) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            print(f"{m}: run.py failed (status {result.returncode}):\n{result.stderr[-2000:]}",
                  file=sys.stderr)
            failed = True
            continue
        curve = summary["reward_curve"]
        with open(os.path.join(out, "trainer.json")) as f:
            trainer_steps = json.load(f)["steps"]
        trainer_walls = [s["wall_seconds"] for s in trainer_steps]
        at = reached(curve, args.target)
        row = {
            "mode": name,
            "trainer_tp": summary.get("trainer_tp", 1),
            "trainer_dp": summary.get("trainer_dp", 1),
            "steps": len(curve),
            "start_reward": round(sum(curve[:3]) / min(3, len(curve)), 3),
            "final_reward": round(sum(curve[-5:]) / min(5, len(curve)), 3),
            "step_reached": at,
            "seconds_reached": round(trainer_walls[at], 1) if at is not None else None,
            "wall_seconds": round(wall, 1),
            "train_seconds": round(sum(s["train_seconds"] for s in trainer_steps), 1),
            "load_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "samples_per_second": summary["samples_per_second"],
            "max_token_staleness": summary["max_token_staleness"],
            # The weight syncs by the runtime's plans: the plans (membership epochs) the
            # runtime made, and each engine's syncs (SyncWeights to weights committed).
            "weight_sync_plans": len(summary.get("runtime_plans") or {}),
            "engine_syncs": summary.get("engine_syncs"),
            "ok": summary["ok"],
        }
        if summary.get("killed"):
            row["killed"] = summary["killed"]
            row["restarts"] = summary["counters"].get("restarts")
            # The syncs the runtime sent again because the engine was lost during them.
            row["weight_sync_replans"] = summary.get("weight_sync_replans")
        rows.append(row)
        failed |= not summary["ok"] or at is None
        print(json.dumps(row), flush=True)
    sys.path.insert(0, _EXAMPLE)
    from plot import plot
    if rows and plot([os.path.join(args.out, r["mode"]) for r in rows],
                     os.path.join(args.out, "reward.png"), target=args.target):
        print(f"plot: {os.path.join(args.out, 'reward.png')}")
    with open(os.path.join(args.out, "learning.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
