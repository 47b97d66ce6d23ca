"""The tiny GRPO run against ``rlsched simulate``: the measured samples/s of sync and
async (staleness 1, partial rollout), and what the simulator predicts for the same
config once given the speeds measured in the runs.

Usage (from the repository root, with Debian's python3-torch and the project built):

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/tiny_grpo_vs_simulate.py \\
        [--steps 20] [--skip 3] [--out DIR] [--rlsched build/rlsched] [-- run.py options...]

Runs ``examples/tiny_grpo/run.py`` once per mode (``--mode sync``; ``--mode async
--max-staleness 1 --partial-rollout``; 2 engines, run.py's defaults otherwise, options
after ``--`` passed to both), then measures from each run:

- the engines' speed: each engine reports its decode steps by the rows it ran and the
  tokens it prefilled in them (a step: the forward pass, the sampling, the finishes it
  made); a least-squares fit of ``seconds = base + per_row * rows + per_prefill_token *
  prefilled`` over both engines' steps gives the simulator's ``decode_base_seconds``,
  ``decode_per_sequence_seconds`` and ``prefill_tokens_per_second`` (1 / per token;
  the simulator prefills each sample apart, the engine a batch at once, and both cost
  the tokens linearly); the context term is 0 (contexts of 5 to 9 tokens);
- the weight sync: the RunReport's ``seconds_per_weight_sync`` (SyncWeights sent to
  WeightsLoaded, per engine; in async it also holds an interrupted engine's wait for
  its step in progress, which the simulator adds again: at most one decode step of a
  few milliseconds unpaced, none paced, where the engine loads within its wait);
- the trainer: its mean seconds per call after the first ``--skip`` (its own clock,
  from StartTrain taken to the step reported: reading the samples, the TP ranks'
  training, publishing), as ``train_call_overhead_seconds`` (``seconds_per_cost_unit``
  1e-9: every call trains 64 samples of the same few tokens, so the cost model has
  nothing to spread);
- the response lengths: every sample's, as ``lengths.lengths`` (``length_correlation``
  0), the prompts' 5 tokens.

Each mode's config (the run's ``run.json``, that SimulatorConfig) is simulated with the
speeds of each run: those of the sync run (measured with generation and training
apart: the prediction proper), and those of the mode's own run (the speeds as they were
while that mode ran). Throughput is compared in steady state: measured, the samples of
the steps after the first ``--skip`` over the trainer's wall time between the ends of
step ``--skip - 1`` and the last step (process start-up and the first steps' lazy
initialisation left out); simulated, the same samples over the difference of the
simulated elapsed time of ``--steps`` steps and of ``--skip`` steps.

Prints per mode the measured and simulated samples/s and their ratio, the async/sync
ratios, and the speeds measured in each run (how much running generation and training
at once slowed each: the machine's 2 cores are shared by the engines, the trainer's
processes, the runtime and other users, which the simulator does not model). Writes
DIR/<mode>/ (run.py's output), DIR/sim_<mode>_<speeds>_<steps>.json (the configs
simulated) and DIR/vs_simulate.json. Exit status 1 when a run fails its checks.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

from tiny_grpo_learning import split_passthrough  # this directory: the same run.py pass-through

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLE = os.path.join(_REPO, "examples", "tiny_grpo")

MODES = {
    "sync": ["--mode", "sync"],
    "async": ["--mode", "async", "--max-staleness", "1", "--partial-rollout"],
}


def fit_engine(decode_steps):
    """Least squares of a step's seconds on (1, rows, prefilled tokens), over the steps
    given as {"rows,prefill": [steps, seconds]} (each key's mean weighted by its count).
    Returns (base, per_row, per_prefill_token, steps), each coefficient >= 0 (a negative
    one is fixed at 0 and the others fitted again)."""
    import numpy as np

    rows, weights = [], []
    for key, (count, seconds) in decode_steps.items():
        n, prefill = (int(x) for x in key.split(","))
        rows.append((1.0, n, prefill, seconds / count))
        weights.append(count)
    if not rows:
        raise ValueError("no decode steps reported")
    data = np.array(rows, dtype=float)
    w = np.sqrt(np.array(weights, dtype=float))
    free = [0, 1, 2]
    while True:
        coef = np.zeros(3)
        solution, *_ = np.linalg.lstsq(data[:, free] * w[:, None], data[:, 3] * w, rcond=None)
        coef[free] = solution
        negative = [i for i in free if coef[i] < 0]
        if not negative:
            return float(coef[0]), float(coef[1]), float(coef[2]), int(sum(weights))
        free = [i for i in free if i != negative[0]]
        if not free:
            return 0.0, 0.0, 0.0, int(sum(weights))


def measure(out, skip):
    """What the run in `out` measured: the engines' fit, the weight sync, the trainer's
    seconds per call, the response lengths, and the steady-state samples/s."""
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    with open(os.path.join(out, "trainer.json")) as f:
        trainer = json.load(f)
    with open(os.path.join(out, "run.json")) as f:
        max_concurrent = int(json.load(f).get("engine", {}).get("max_concurrent", 32))
    steps_merged = {}
    for path in sorted(glob.glob(os.path.join(out, "engine*.json"))):
        with open(path) as f:
            for key, (count, seconds) in json.load(f).get("decode_steps", {}).items():
                s = steps_merged.setdefault(key, [0, 0.0])
                s[0] += count
                s[1] += seconds
    base, per_row, per_token, decode_steps = fit_engine(steps_merged)
    lengths = []
    for path in glob.glob(os.path.join(out, "data", "samples", "*.json")):
        with open(path) as f:
            lengths.append(len(json.load(f)["response"]))
    calls = trainer["steps"]
    if len(calls) <= skip + 1:
        raise ValueError(f"{out}: {len(calls)} steps, --skip {skip} leaves too few")
    samples = sum(c["samples"] for c in calls[skip:])
    wall = calls[-1]["wall_seconds"] - calls[skip - 1]["wall_seconds"] if skip else (
        calls[-1]["wall_seconds"])
    train = [c["train_seconds"] for c in calls[skip:]]
    metrics = report["metrics"]
    return {
        "decode_base_seconds": base,
        "decode_per_sequence_seconds": per_row,
        "prefill_seconds_per_token": per_token,
        "decode_steps": decode_steps,
        "max_concurrent": max_concurrent,
        "weight_sync_seconds": float(metrics.get("seconds_per_weight_sync", 0.0)),
        "train_seconds_per_call": sum(train) / len(train),
        "lengths": sorted(lengths),
        "mean_length": sum(lengths) / len(lengths),
        "steady_samples_per_second": samples / wall,
        "steady_samples": samples,
        "steady_wall_seconds": wall,
        "run_samples_per_second": float(metrics["samples_per_second"]),
        "wall_seconds": summary["wall_seconds"],
        "trainer_idle_ratio": float(metrics.get("trainer_idle_ratio", 0.0)),
        "mean_engine_idle_ratio": float(metrics.get("mean_engine_idle_ratio", 0.0)),
        "requests_mean_seconds": float((report.get("requests") or {}).get("mean_seconds", 0)),
        "cpu_seconds": {name: r.get("cpu_seconds") for name, r in _reports(out).items()},
        "ok": summary["ok"],
    }


def _reports(out):
    reports = {}
    for path in glob.glob(os.path.join(out, "*.json")):
        name = os.path.basename(path)[:-5]
        if name.startswith(("engine", "trainer")):
            with open(path) as f:
                reports[name] = json.load(f)
    return reports


def sim_config(run_config, speeds, steps, max_concurrent):
    """`run_config` (a run's SimulatorConfig) with the measured `speeds` and `steps`."""
    config = json.loads(json.dumps(run_config))
    config["steps"] = steps
    per_token = speeds["prefill_seconds_per_token"]
    config["engine"] = {
        "max_concurrent": max_concurrent,
        "decode_base_seconds": speeds["decode_base_seconds"],
        "decode_per_sequence_seconds": speeds["decode_per_sequence_seconds"],
        "decode_per_context_token_seconds": 0.0,
        "prefill_tokens_per_second": 1.0 / per_token if per_token > 1e-12 else 1e12,
    }
    lengths = config.setdefault("lengths", {})
    lengths["lengths"] = speeds["lengths"]
    lengths["length_correlation"] = 0.0
    config["weight_sync_seconds"] = speeds["weight_sync_seconds"]
    config["seconds_per_cost_unit"] = 1e-9
    config["train_call_overhead_seconds"] = speeds["train_seconds_per_call"]
    return config


def simulate(rlsched, path):
    out = subprocess.run([rlsched, "simulate", "--config", path, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["runs"][0]["report"]["metrics"]


def main(argv=None) -> int:
    argv, extra = split_passthrough(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip", type=int, default=3,
                        help="steps left out at the start of the steady-state throughput")
    parser.add_argument("--out", default="/tmp/tiny-grpo-vs-simulate")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the runs already in --out instead of running them")
    parser.add_argument("--rlsched", default=os.environ.get("RLSCHED_BIN")
                        or os.path.join(_REPO, "build", "rlsched"))
    args = parser.parse_args(argv)
    if not 1 <= args.skip <= args.steps - 2:
        parser.error(f"--skip must be in [1, --steps - 2 = {args.steps - 2}], got {args.skip}")
    os.makedirs(args.out, exist_ok=True)
    measured, failed = {}, False
    for mode, options in MODES.items():
        out = os.path.join(args.out, mode)
        if not args.reuse:
            load = os.getloadavg()[0]
            start = time.monotonic()
            result = subprocess.run(
                [sys.executable, os.path.join(_EXAMPLE, "run.py"), "--rlsched-bin",
                 args.rlsched, "--out", out, "--steps", str(args.steps), "--engines", "2",
                 *options, *extra], capture_output=True, text=True)
            print(f"{mode}: run.py {time.monotonic() - start:.1f} s, status "
                  f"{result.returncode}, load {load:.2f} -> {os.getloadavg()[0]:.2f}",
                  flush=True)
            if result.returncode != 0:
                print(result.stderr[-2000:], file=sys.stderr)
        try:
            measured[mode] = measure(out, args.skip)
        except (OSError, ValueError, KeyError) as e:
            print(f"{mode}: cannot measure the run in {out}: {e}", file=sys.stderr)
            return 1
        failed |= not measured[mode]["ok"]

    results = {}
    for mode in MODES:
        with open(os.path.join(args.out, mode, "run.json")) as f:
            run_config = json.load(f)
        max_concurrent = measured[mode]["max_concurrent"]
        per_step = run_config["orchestrator"]["prompts_per_step"] * run_config[
            "orchestrator"]["samples_per_prompt"]
        for source in ("sync", mode):
            speeds = dict(measured[source])
            speeds["lengths"] = measured[mode]["lengths"]  # the workload: the mode's own
            elapsed = {}
            for steps in (args.skip, args.steps):
                path = os.path.join(args.out, f"sim_{mode}_{source}_{steps}.json")
                with open(path, "w") as f:
                    json.dump(sim_config(run_config, speeds, steps, max_concurrent), f,
                              indent=1)
                elapsed[steps] = simulate(args.rlsched, path)["elapsed_seconds"]
            rate = (args.steps - args.skip) * per_step / (elapsed[args.steps] - elapsed[args.skip])
            results[(mode, source)] = rate
    rows = []
    print(f"\nsteady state: steps {args.skip}..{args.steps - 1} of {args.steps}")
    print(f"{'mode':<7}{'measured':>10}{'sim (sync speeds)':>19}{'ratio':>7}"
          f"{'sim (own speeds)':>18}{'ratio':>7}")
    for mode in MODES:
        m = measured[mode]["steady_samples_per_second"]
        a, b = results[(mode, "sync")], results[(mode, mode)]
        rows.append({"mode": mode, "measured": m, "simulated_sync_speeds": a,
                     "simulated_own_speeds": b})
        print(f"{mode:<7}{m:>10.2f}{a:>19.2f}{m / a:>7.3f}{b:>18.2f}{m / b:>7.3f}")
    ratio = {"measured": measured["async"]["steady_samples_per_second"]
             / measured["sync"]["steady_samples_per_second"],
             "simulated_sync_speeds": results[("async", "sync")] / results[("sync", "sync")],
             "simulated_own_speeds": results[("async", "async")] / results[("sync", "sync")]}
    by_sync, by_own = ratio["simulated_sync_speeds"], ratio["simulated_own_speeds"]
    print(f"async/sync: measured {ratio['measured']:.3f}, simulated {by_sync:.3f} (sync "
          f"speeds; measured/simulated {ratio['measured'] / by_sync:.3f}), {by_own:.3f} "
          f"(each mode's own speeds; {ratio['measured'] / by_own:.3f})")
    print("\nspeeds measured (per run):")
    for mode in MODES:
        s = measured[mode]
        n = s["max_concurrent"]
        full = s["decode_base_seconds"] + s["decode_per_sequence_seconds"] * n
        print(f"  {mode}: decode step {1e3 * s['decode_base_seconds']:.2f} ms + "
              f"{1e3 * s['decode_per_sequence_seconds']:.3f} ms/row ({n} rows: "
              f"{n / full:.0f} tokens/s; 1 row: "
              f"{1 / (s['decode_base_seconds'] + s['decode_per_sequence_seconds']):.0f}), "
              f"prefill {1e6 * s['prefill_seconds_per_token']:.1f} us/token "
              f"({s['decode_steps']} steps); weight sync {1e3 * s['weight_sync_seconds']:.1f} ms;"
              f" trainer {s['train_seconds_per_call']:.3f} s/call; mean response "
              f"{s['mean_length']:.2f} tokens; whole run {s['run_samples_per_second']:.2f} "
              f"samples/s over {s['wall_seconds']:.1f} s")
    # What overlapping generation and training cost on this machine: the async run's
    # speeds against the sync run's.
    def full_step(s):
        return s["decode_base_seconds"] + s["decode_per_sequence_seconds"] * s["max_concurrent"]
    sync_s, async_s = measured["sync"], measured["async"]
    slowdown = {"trainer_seconds_per_call": async_s["train_seconds_per_call"]
                / sync_s["train_seconds_per_call"],
                "engine_full_step": full_step(async_s) / full_step(sync_s)}
    print(f"  async run against sync run: trainer {slowdown['trainer_seconds_per_call']:.3f}x "
          f"the seconds per call, engine {slowdown['engine_full_step']:.3f}x the decode "
          "step at full concurrency")
    with open(os.path.join(args.out, "vs_simulate.json"), "w") as f:
        json.dump({"steps": args.steps, "skip": args.skip, "rows": rows, "async_over_sync": ratio,
                   "async_run_over_sync_run": slowdown,
                   "measured": {m: {k: v for k, v in s.items() if k != "lengths"}
                                for m, s in measured.items()}}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
