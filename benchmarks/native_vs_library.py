"""The in-process Python call (rlsched._native) against the C++ library's own time for
the same call, in the same run (issue 14's target: <= 1.3x).

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/native_vs_library.py \
        [--calls 30] [--sizes 16384:128,65536:256] [--check 1.3]

For each size (n sequences into k parts) and equal_size off and on, over CALLS
heavy-tailed batches (seed i: prompt uniform in [100, 500] + response
log-normal(6.67, 1.15) clipped at 16,384, as benchmarks/python_client.py), times per
batch, interleaved:

  library   Balance() alone, timed in C++ by the module (_native._time_balance):
            the reference;
  _native   rlsched._native.balance(array) from Python (numpy int64 in, numpy
            arrays out; argument parsing and the result dict included);
  get_seqlen(array) / get_seqlen(list)
            rlsched.get_seqlen_balanced_partitions(lengths, k, equal_size) in process
            on a numpy int64 array / a Python list: k lists of Python ints, as verl's
            function returns.

Prints the minimum and the median in ms and their ratios to the library's (on a
shared machine the minimum is the steadier figure). With --check R the exit status is
1 when get_seqlen(array)'s ratio of minima is above R on any size.
"""

import argparse
import os
import random
import statistics
import sys
import time


def heavy_tailed(n, seed):
    rng = random.Random(seed)
    return [rng.randint(100, 500) + min(16384, int(rng.lognormvariate(6.67, 1.15)))
            for _ in range(n)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--sizes", default="16384:128,65536:256")
    parser.add_argument("--check", type=float, default=None)
    args = parser.parse_args()

    import numpy as np
    import rlsched
    from rlsched import _native

    os.environ.pop("RLSCHED_NATIVE", None)
    if not rlsched._in_process():
        print("rlsched does not run in process (rlsched._native missing?)", file=sys.stderr)
        return 2
    worst = 0.0
    for size in args.sizes.split(","):
        n, k = (int(x) for x in size.split(":"))
        batches = [heavy_tailed(n, seed) for seed in range(1, args.calls + 1)]
        arrays = [np.asarray(b, dtype=np.int64) for b in batches]
        for equal_size in (False, True):
            # Warm-up: one of each.
            _native._time_balance(arrays[0], k, equal_size, 1)
            rlsched.get_seqlen_balanced_partitions(arrays[0], k, equal_size)
            times = {"library": [], "_native": [], "get_seqlen(array)": [],
                     "get_seqlen(list)": []}
            for lengths, array in zip(batches, arrays):
                times["library"] += _native._time_balance(array, k, equal_size, 1)
                start = time.perf_counter()
                result = _native.balance(array, k, equal_size)
                times["_native"].append(time.perf_counter() - start)
                start = time.perf_counter()
                parts = rlsched.get_seqlen_balanced_partitions(array, k, equal_size)
                times["get_seqlen(array)"].append(time.perf_counter() - start)
                start = time.perf_counter()
                parts_list = rlsched.get_seqlen_balanced_partitions(lengths, k, equal_size)
                times["get_seqlen(list)"].append(time.perf_counter() - start)
                assert parts == parts_list and len(parts) == k
                assert sorted(i for p in parts for i in p) == list(range(n))
                assert result["indices"].size == n
            library_min = min(times["library"])
            library_median = statistics.median(times["library"])
            print(f"n = {n}, k = {k}, equal_size = {equal_size}, {args.calls} calls "
                  f"(ms and ratio to the library: min, median)")
            for name, values in times.items():
                low, median = min(values), statistics.median(values)
                print(f"  {name:>18}  min {low * 1e3:8.3f} {low / library_min:5.2f}x"
                      f"  median {median * 1e3:8.3f} {median / library_median:5.2f}x")
                if name == "get_seqlen(array)":
                    worst = max(worst, low / library_min)
    if args.check is not None and worst > args.check:
        print(f"get_seqlen(array) at {worst:.2f}x the library: above {args.check}x",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
