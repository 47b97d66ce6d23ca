"""What sending each engine its part of the weight-sync plan costs a live run.

Usage (from the repository root, with Debian's python3 and the project built):

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/weight_sync_run.py \
        [--rlsched build/rlsched] [--engines 8] [--steps 4] [--bucket-mib 64] [--repeat 3]

Runs the same config (tests/data/run/async-s1.json with the given steps and engines)
with emulated workers (`rlsched run --emulated-engines N --emulated-trainer --json`),
without a weight layout and with Llama-3.1-70B's (--model
tests/data/configs/llama-3.1-70b.json --train tp=8,pp=2,dp=4 --infer tp=4: a plan per
membership, each engine's part sent once per plan, the trainer's part listing every
transfer; the emulated workers decode and check every part they get), alternating, and
prints per run the wall seconds, samples/s and the event-to-command latency (p99,
largest: the SyncWeights that first uses a plan pays for writing the plan file and
reading the engine's parts out of it), then the medians and their ratios (with /
without).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(rlsched, config, engines, layout):
    out = subprocess.run([rlsched, "run", "--config", config, "--emulated-engines", str(engines),
                          "--emulated-trainer", "--time-scale", "0.005", "--json", *layout],
                         check=True, capture_output=True, text=True, timeout=1800).stdout
    report = json.loads(out)
    assert report["done"], report
    return {"wall_seconds": report["wall_seconds"],
            "samples_per_second": report["metrics"]["samples_per_second"],
            "p99_ms": 1e3 * report.get("command_latency_p99_seconds", 0.0),
            "max_ms": 1e3 * report.get("command_latency_max_seconds", 0.0)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rlsched", default=os.environ.get(
        "RLSCHED_BIN", os.path.join(_REPO, "build", "rlsched")))
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with open(os.path.join(_REPO, "tests", "data", "run", "async-s1.json")) as f:
        config = json.load(f)
    config["steps"] = args.steps
    config["engines"] = args.engines
    layout = ["--model", os.path.join(_REPO, "tests", "data", "configs", "llama-3.1-70b.json"),
              "--train", "tp=8,pp=2,dp=4", "--infer", "tp=4", "--bucket-mib",
              str(args.bucket_mib)]
    results = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        with open(path, "w") as f:
            json.dump(config, f)
        for i in range(args.repeat):
            for name, extra in (("without", []), ("with", layout)):
                r = _run(args.rlsched, path, args.engines, extra)
                results[name].append(r)
                print(f"{name:>8} #{i}: wall {r['wall_seconds']:.2f} s, samples/s "
                      f"{r['samples_per_second']:.2f}, command latency p99 {r['p99_ms']:.2f} ms, "
                      f"max {r['max_ms']:.2f} ms", flush=True)
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for name, runs in results.items()}
    for k in ("wall_seconds", "samples_per_second", "p99_ms", "max_ms"):
        a, b = med["with"][k], med["without"][k]
        print(f"median {k}: with {a:.3f}, without {b:.3f}, ratio {a / b if b else float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
