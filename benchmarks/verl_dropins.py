"""rlsched.integrations.verl's get_seqlen_balanced_partitions against verl's own, on
verl's inputs: the workload key 24576·L + L² of heavy-tailed rollout lengths (seed i:
prompt uniform in [100, 500] + response log-normal(6.67, 1.15) clipped at 16,384, as
benchmarks/native_vs_library.py).

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/verl_dropins.py \
        --verl-source /path/to/verl/verl/utils/seqlen_balancing.py [--seeds 20]

verl is not a dependency and none of its code is in this repository: --verl-source
names a file of a verl checkout, from which the functions karmarkar_karp and
get_seqlen_balanced_partitions (they need only heapq) are compiled at run time;
without it the reference is the Karmarkar-Karp stand-in of tests/python/test_verl.py.

For each size (n sequences into k parts, equal size or not) prints the largest part's
load, rlsched over the reference (mean, worst, best over the seeds: <= 1 is at least
as balanced), and the median time of a call of each, measured in the same run,
interleaved.
"""

import argparse
import ast
import heapq
import os
import random
import statistics
import sys
import time

SIZES = [(1024, 16, True), (1024, 16, False), (4096, 32, True), (4096, 8, False),
         (16384, 128, True)]


def lengths(n, seed):
    rng = random.Random(seed)
    return [rng.randint(100, 500) + min(16384, int(rng.lognormvariate(6.67, 1.15)))
            for _ in range(n)]


def reference_from(path):
    """verl's get_seqlen_balanced_partitions compiled from its source file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    wanted = {"karmarkar_karp", "get_seqlen_balanced_partitions"}
    functions = [node for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name in wanted]
    if {node.name for node in functions} != wanted:
        sys.exit(f"{path}: does not define {sorted(wanted)}")
    namespace = {"heapq": heapq}
    exec(compile(ast.Module(body=functions, type_ignores=[]), path, "exec"), namespace)
    return namespace["get_seqlen_balanced_partitions"]


def reference_standin():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(os.path.dirname(here), "tests", "python"))
    import test_verl  # noqa: E402  (the stand-in's source)
    namespace = {}
    source = test_verl.STANDIN_SOURCE.replace(
        "from verl.utils import tensordict_utils as tu", "")
    exec(compile(source, "standin", "exec"), namespace)
    return namespace["get_seqlen_balanced_partitions"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl-source", help="verl/utils/seqlen_balancing.py of a checkout")
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()

    from rlsched.integrations import verl as rlsched_verl
    if args.verl_source:
        reference, name = reference_from(args.verl_source), "verl"
    else:
        reference, name = reference_standin(), "stand-in KK"
    print(f"reference: {name}; {args.seeds} seeds per size")
    for n, k, equal_size in SIZES:
        ratios, ours_times, reference_times = [], [], []
        for seed in range(args.seeds):
            weights = [24576 * length + length * length for length in lengths(n, seed)]
            start = time.perf_counter()
            ours = rlsched_verl.get_seqlen_balanced_partitions(weights, k, equal_size)
            middle = time.perf_counter()
            theirs = reference(weights, k, equal_size)
            end = time.perf_counter()
            ours_times.append(middle - start)
            reference_times.append(end - middle)
            ours_max = max(sum(weights[i] for i in part) for part in ours)
            theirs_max = max(sum(weights[i] for i in part) for part in theirs)
            ratios.append(ours_max / theirs_max)
        ours_ms = statistics.median(ours_times) * 1e3
        reference_ms = statistics.median(reference_times) * 1e3
        print(f"n={n:6d} k={k:4d} equal_size={str(equal_size):5s}  largest part "
              f"rlsched/{name}: mean {statistics.mean(ratios):.5f} worst {max(ratios):.5f} "
              f"best {min(ratios):.5f}   median time rlsched {ours_ms:8.2f} ms, "
              f"{name} {reference_ms:9.2f} ms ({reference_ms / ours_ms:.0f}x)")


if __name__ == "__main__":
    main()
