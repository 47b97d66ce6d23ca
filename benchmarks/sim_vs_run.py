"""The same config simulated and run live with emulated workers, per mode.

Usage (from the repository root, with Debian's python3 and the project built):

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/sim_vs_run.py \
        [--config tests/data/run/async-s1.json] [--time-scale 0.05] [--rlsched build/rlsched]

For each mode (sync, one_step_off, async with the config's staleness and partial
rollout), the config is simulated (`rlsched simulate --json`) and run (`rlsched run
--emulated-engines N --emulated-trainer --time-scale X --json`: real processes on a
real Unix socket, the emulated engines drawing the simulator's own lengths and
rewards). Prints samples/s of both, their ratio (run / simulated; the live runtime
issue's target: within 10%), and whether the modes rank the same way
(sync < one_step_off < async). Exit status 1 when a run fails.

The emulated workers run `time_scale` times faster than the simulated clock: at 0.05
a simulated second lasts 50 ms of wall time. Too small a scale makes the Python
workers fall behind their own clock on a small machine (the run is then slower than
the simulation).
"""

import argparse
import copy
import json
import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mode_config(config, mode):
    config = copy.deepcopy(config)
    orchestrator = config.setdefault("orchestrator", {})
    orchestrator["mode"] = "ORCHESTRATOR_MODE_" + mode.upper()
    if mode != "async":
        for field in ("max_staleness", "partial_rollout", "staleness_policy",
                      "staleness_fraction"):
            orchestrator.pop(field, None)
    return config


def _simulate(rlsched, path):
    out = subprocess.run([rlsched, "simulate", "--config", path, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["runs"][0]["report"]["metrics"]


def _run(rlsched, path, engines, scale):
    out = subprocess.run([rlsched, "run", "--config", path, "--emulated-engines", str(engines),
                          "--emulated-trainer", "--time-scale", str(scale), "--json"],
                         check=True, capture_output=True, text=True, timeout=1800).stdout
    return json.loads(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(_REPO, "tests/data/run/async-s1.json"))
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--rlsched", default=os.environ.get(
        "RLSCHED_BIN", os.path.join(_REPO, "build/rlsched")))
    parser.add_argument("--out-dir", default="/tmp")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    engines = int(config.get("engines", 8))
    print(f"{os.path.relpath(args.config, _REPO)}: {engines} emulated engines, "
          f"time scale {args.time_scale}")
    print(f"{'mode':<14}{'simulated':>11}{'run':>11}{'ratio':>8}{'wall s':>9}")
    rates = {}
    ok = True
    for mode in ("sync", "one_step_off", "async"):
        path = os.path.join(args.out_dir, f"sim_vs_run_{mode}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_mode_config(config, mode), f)
        simulated = _simulate(args.rlsched, path)["samples_per_second"]
        try:
            report = _run(args.rlsched, path, engines, args.time_scale)
        except subprocess.SubprocessError as e:
            print(f"{mode:<14}{simulated:>11.3f}  run FAILED: {e}")
            ok = False
            continue
        run = report["metrics"]["samples_per_second"]
        ok = ok and report.get("done", False)
        rates[mode] = (simulated, run)
        print(f"{mode:<14}{simulated:>11.3f}{run:>11.3f}{run / simulated:>8.3f}"
              f"{report['wall_seconds']:>9.1f}")
    if len(rates) == 3:
        ratios = [run / sim for sim, run in rates.values()]
        within = all(abs(r - 1) <= 0.10 for r in ratios)
        order = [m for m in ("sync", "one_step_off", "async")]
        ranked_sim = sorted(order, key=lambda m: rates[m][0])
        ranked_run = sorted(order, key=lambda m: rates[m][1])
        print(f"within 10%: {'PASS' if within else 'FAIL'} (ratios "
              f"{', '.join(f'{r:.3f}' for r in ratios)}); ranking simulated "
              f"{' < '.join(ranked_sim)}, run {' < '.join(ranked_run)}: "
              f"{'PASS' if ranked_sim == ranked_run == order else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
