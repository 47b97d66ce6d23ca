"""Per-call time of the Python client (python/rlsched) against a real `rlsched serve`.

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/python_client.py \
        [--bin build/rlsched] [--calls 50] [--n 16384] [--k 128]

Times (time.perf_counter around the call, serialisation, pipes and parsing included)
`get_seqlen_balanced_partitions(lengths, k, equal_size)` for equal_size off and on,
over CALLS heavy-tailed batches (seed i: prompt uniform in [100, 500] + response
log-normal(6.67, 1.15) clipped at 16,384, from random.Random), after one warm-up
call that starts the daemon. Also times a ping (the pipe round trip alone). Every
answer is checked (each index once, k parts); a bad one makes the exit status 1.
Prints the median, p90 and max per call in milliseconds.
"""

import argparse
import math
import os
import random
import statistics
import sys
import time


def heavy_tailed(n, seed):
    rng = random.Random(seed)
    return [rng.randint(100, 500) + min(16384, int(rng.lognormvariate(6.67, 1.15)))
            for _ in range(n)]


def summary(times_ms):
    ordered = sorted(times_ms)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return f"median {statistics.median(ordered):7.3f}  p90 {p90:7.3f}  max {ordered[-1]:7.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=os.environ.get("RLSCHED_BIN", "build/rlsched"))
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--k", type=int, default=128)
    args = parser.parse_args()

    import rlsched  # after argparse: --help works without the modules

    batches = [heavy_tailed(args.n, seed) for seed in range(1, args.calls + 1)]
    ok = True
    with rlsched.Client(args.bin) as client:
        client.get_seqlen_balanced_partitions(batches[0], args.k, False)  # warm-up
        ping_ms = []
        for _ in range(args.calls):
            start = time.perf_counter()
            client.ping()
            ping_ms.append((time.perf_counter() - start) * 1e3)
        print(f"n = {args.n}, k = {args.k}, {args.calls} calls; per call in ms")
        print(f"{'ping':>24}  {summary(ping_ms)}")
        for equal_size in (False, True):
            times_ms = []
            for lengths in batches:
                start = time.perf_counter()
                parts = client.get_seqlen_balanced_partitions(lengths, args.k, equal_size)
                times_ms.append((time.perf_counter() - start) * 1e3)
                flat = sorted(i for part in parts for i in part)
                if len(parts) != args.k or flat != list(range(args.n)):
                    print(f"bad answer (equal_size={equal_size})", file=sys.stderr)
                    ok = False
            label = f"equal_size={equal_size}"
            print(f"{label:>24}  {summary(times_ms)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
