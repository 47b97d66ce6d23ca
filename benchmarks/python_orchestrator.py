"""The decision core driven from Python (rlsched.Orchestrator) against the core's own
time for the same events, in the same run.

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/python_orchestrator.py \
        [--steps 20] [--engines 16] [--repeats 5]

A seeded run of the tests' discrete-event driver (tests/python/_orchestrator_driver.py:
async, staleness 1, partial rollout, P = 64 prompts x G = 8 samples, 16 engines of 32
slots) records its events; then, on fresh cores, interleaved REPEATS times:

  core        the C++ core alone over the recorded events (converted beforehand),
              timed in C++ around Handle() (_native._time_replay): the reference;
  handle_many rlsched.Orchestrator.handle_many(serialized events): one native call,
              the commands parsed into rlsched.v1.OrchestratorCommand messages;
  handle(msg) one handle() per event, events as OrchestratorEvent messages;
  handle(dict) one handle() per event, events as {kind: {fields}} (what the keyword
              methods such as core.generation_finished(...) do).

Prints events/s (best run) and each path's time as a ratio of the core's.
"""

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "tests", "python"))

import rlsched  # noqa: E402
from rlsched import _native  # noqa: E402
from rlsched import orchestrator as orchestrator_module  # noqa: E402
from _orchestrator_driver import Driver  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--engines", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not orchestrator_module.available():
        sys.exit("rlsched._native has no wire library (HAS_WIRE is False)")

    config = {"orchestrator": {"mode": "ORCHESTRATOR_MODE_ASYNC", "max_staleness": 1,
                               "partial_rollout": True, "prompts_per_step": 64,
                               "samples_per_prompt": 8}, "steps": args.steps}
    recorded = Driver(rlsched.Orchestrator(config), seed=1, engines=args.engines,
                      max_concurrent=32, prompts=64 * (args.steps + 3),
                      train_seconds=(5.0, 10.0), max_events=10**7).run()
    dicts = [event for event, _ in recorded.log]
    messages = [orchestrator_module._make_event(*next(iter(e.items()))) for e in dicts]
    serialized = [m.SerializeToString() for m in messages]
    n = len(serialized)
    commands = sum(len(c) for _, c in recorded.log)
    import json
    config_json = json.dumps(config)

    def run_core():
        return min(_native._time_replay(config_json, True, serialized, 1))

    def timed(function):
        def run():
            core = rlsched.Orchestrator(config)
            start = time.perf_counter()
            function(core)
            return time.perf_counter() - start
        return run

    def by_message(core):
        for m in messages:
            core.handle(m)

    def by_dict(core):
        for e in dicts:
            core.handle(e)

    paths = {"core": run_core,
             "handle_many": timed(lambda core: core.handle_many(serialized)),
             "handle(msg)": timed(by_message),
             "handle(dict)": timed(by_dict)}
    best = {name: float("inf") for name in paths}
    for _ in range(args.repeats):
        for name, run in paths.items():
            best[name] = min(best[name], run())
    print(f"{n} events, {commands} commands ({args.steps} steps, {args.engines} engines), "
          f"best of {args.repeats}:")
    for name, seconds in best.items():
        print(f"  {name:13s} {seconds * 1e3:9.2f} ms  {n / seconds:12,.0f} events/s  "
              f"{seconds / best['core']:6.2f}x the core")


if __name__ == "__main__":
    main()
