"""What sending each engine its part of the weight-sync plan costs a live run.

Usage (from the repository root, with Debian's python3 and the project built):

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/weight_sync_run.py \
        [--rlsched build/rlsched] [--compare OTHER_RLSCHED] [--layout llama-70b|qwen3-235b] \
        [--engines 8] [--steps 4] [--bucket-mib 64] [--repeat 3]

Runs the same config (tests/data/run/async-s1.json with the given steps and engines)
with emulated workers (`rlsched run --emulated-engines N --emulated-trainer --json`),
without a weight layout and with one (--layout llama-70b, the default: Llama-3.1-70B,
--train tp=8,pp=2,dp=4 --infer tp=4, 5,194 transfers at 64 MiB buckets; qwen3-235b:
Qwen3-235B-A22B, --train tp=4,pp=2,ep=4 --infer tp=4, ~148k transfers): a plan per
membership, each engine's part sent once per plan, the trainer's part listing every
transfer; the emulated workers decode and check every part they get. The runs
alternate, and print per run the wall seconds, samples/s and the event-to-command
latency (p99, largest: the SyncWeights that first uses a plan pays for the plan's id
and the parts it sends), then the medians and their ratios (with / without).

With --compare OTHER, each round also runs OTHER with the layout (e.g. a build of an
earlier commit), alternating with --rlsched's runs, and the medians compare the two.

Per-plan costs: the runs log at info level (--log-level info); a program that reports
its plans' costs ("weight-sync plan ID: ...; id, index and the trainer's part in X ms",
from the worker server, and "weight-sync epoch E (N engines): waited X ms for the plan",
from the runtime's weight-sync node, which waits when the planner has not finished the
membership's plan) has them summed per run (and their largest) after the run's line.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LAYOUTS = {
    "llama-70b": ["--model", os.path.join(_REPO, "tests", "data", "configs", "llama-3.1-70b.json"),
                  "--train", "tp=8,pp=2,dp=4", "--infer", "tp=4"],
    "qwen3-235b": ["--model", os.path.join(_REPO, "tests", "data", "configs",
                                           "qwen3-235b-a22b.json"),
                   "--train", "tp=4,pp=2,ep=4", "--infer", "tp=4"],
}

_PLAN_COST = re.compile(r"weight-sync plan (\S+): .*in ([0-9.]+) ms")
_PLAN_WAIT = re.compile(r"weight-sync epoch \d+ .*: waited ([0-9.]+) ms for the plan")


def _run(rlsched, config, engines, layout, heartbeat_timeout):
    done = subprocess.run([rlsched, "--log-level", "info", "run", "--config", config,
                           "--emulated-engines", str(engines), "--emulated-trainer",
                           "--time-scale", "0.005", "--heartbeat-timeout",
                           str(heartbeat_timeout), "--json", *layout],
                          check=True, capture_output=True, text=True, timeout=3600)
    report = json.loads(done.stdout)
    assert report["done"], report
    lines = done.stderr.splitlines()
    costs = [float(m.group(2)) for m in map(_PLAN_COST.search, lines) if m]
    waits = [float(m.group(1)) for m in map(_PLAN_WAIT.search, lines) if m]
    return {"wall_seconds": report["wall_seconds"],
            "samples_per_second": report["metrics"]["samples_per_second"],
            "p99_ms": 1e3 * report.get("command_latency_p99_seconds", 0.0),
            "max_ms": 1e3 * report.get("command_latency_max_seconds", 0.0),
            "plans": costs, "waits": waits}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rlsched", default=os.environ.get(
        "RLSCHED_BIN", os.path.join(_REPO, "build", "rlsched")))
    parser.add_argument("--compare", default=None,
                        help="another rlsched binary, run with the layout in each round")
    parser.add_argument("--layout", choices=sorted(_LAYOUTS), default="llama-70b")
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--heartbeat-timeout", type=float, default=None,
                        help="rlsched run's --heartbeat-timeout (default: 10 s, 600 s with "
                             "qwen3-235b, whose ~20 MB trainer part the Python worker takes "
                             "longer than 10 s to read)")
    args = parser.parse_args(argv)
    with open(os.path.join(_REPO, "tests", "data", "run", "async-s1.json")) as f:
        config = json.load(f)
    config["steps"] = args.steps
    config["engines"] = args.engines
    layout = _LAYOUTS[args.layout] + ["--bucket-mib", str(args.bucket_mib)]
    heartbeat = args.heartbeat_timeout
    if heartbeat is None:
        heartbeat = 600.0 if args.layout == "qwen3-235b" else 10.0
    kinds = [("without", args.rlsched, []), ("with", args.rlsched, layout)]
    if args.compare:
        kinds.append(("compare", args.compare, layout))
    results = {name: [] for name, _, _ in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        with open(path, "w") as f:
            json.dump(config, f)
        for i in range(args.repeat):
            # Alternate the order too, so that neither binary always runs first.
            order = kinds if i % 2 == 0 else [kinds[0]] + kinds[:0:-1]
            for name, binary, extra in order:
                r = _run(binary, path, args.engines, extra, heartbeat)
                results[name].append(r)
                print(f"{name:>8} #{i}: wall {r['wall_seconds']:.2f} s, samples/s "
                      f"{r['samples_per_second']:.2f}, command latency p99 {r['p99_ms']:.2f} ms, "
                      f"max {r['max_ms']:.2f} ms", flush=True)
                if r["plans"]:
                    print(f"{'':>8}     {len(r['plans'])} plans: id, index and the trainer's "
                          f"part {sum(r['plans']):.1f} ms in all, largest "
                          f"{max(r['plans']):.1f} ms", flush=True)
                if r["waits"]:
                    print(f"{'':>8}     {len(r['waits'])} memberships: the weight-sync node "
                          f"waited for their plans {sum(r['waits']):.1f} ms in all, largest "
                          f"{max(r['waits']):.1f} ms", flush=True)
    keys = ("wall_seconds", "samples_per_second", "p99_ms", "max_ms")
    med = {name: {k: statistics.median(r[k] for r in runs) for k in keys}
           for name, runs in results.items()}
    others = ["without"] + (["compare"] if args.compare else [])
    for k in keys:
        a = med["with"][k]
        for other in others:
            b = med[other][k]
            print(f"median {k}: with {a:.3f}, {other} {b:.3f}, ratio "
                  f"{a / b if b else float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
