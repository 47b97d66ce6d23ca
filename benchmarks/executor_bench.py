"""The weight-sync executor (python/rlsched/weight_sync/executor.py) against plain broadcasts of the
same bytes, on one machine: one forked process per rank, torch.distributed with gloo on
loopback.

    PYTHONPATH=python:build/python RLSCHED_BIN=build/rlsched /usr/bin/python3 \\
        benchmarks/executor_bench.py [--model config.json] [--train tp=2,pp=2] \\
        [--infer tp=2,replicas=2] [--colocated] [--bucket-mib 64] \\
        [--target-dtype bf16|fp8_block128] [--repeat 3] [--baseline REV] \\
        [--profile RANK] [--keep-staging] [--json]

Default world: 8 ranks, a Llama-shaped model of about 190 M parameters (hidden 1024,
8 layers, FFN 4096, 32,000 tokens; 380 MB in bf16) from Megatron TP 2 x PP 2 (4 ranks) to
2 vLLM replicas of TP 2 (4 other ranks), 64 MiB buckets; `--target-dtype fp8_block128`:
the engines hold their linear weights in fp8 (quantised by the senders where a slice
covers whole 128 x 128 blocks, else by the engines).

Measured in REPEAT rounds, each one sync of every variant in an order that rotates from
round to round (so that a change in the machine's load hits them alike), each the best
of its rounds and the slowest rank's time:
- executor: `Executor.run()` (packing, the collectives, unpacking into the destination
  tensors); its construction (checks, process groups) is reported apart;
- baseline (with `--baseline REV`): the same for the executor as of git
  revision REV (or a file), loaded beside this one: before / after in one run; its
  ratio is against its own plain broadcasts (baseline plain: its schedule's
  collectives, which may be fewer or more);
- kept (with `--keep-staging`): the executor with `keep_staging=True` (its staging
  buffer allocated once, kept between syncs);
- plain: the same collectives (per bucket, one per source and destination set, the
  same sizes, groups and order, issued asynchronously then waited for) on buffers
  allocated once, with no packing or unpacking: what the transport alone costs;
- the ratio executor / plain (the target is <= 1.5);
- the CPU time of a sync (user + system, all ranks summed: on a machine with fewer
  cores than ranks, wall time follows it), and the part of it in the ranks' main
  threads (the executor's own work; the rest is gloo's threads moving the bytes);
- peak staging bytes per rank (the executor's own count) and the growth of the rank's
  peak resident memory during `run()` (VmHWM, reset before each run, minus VmRSS at
  the start), against the bucket budget, and during the set-up;
- fp8: the quantiser's throughput on one core (GB/s of bf16 input, before the ranks
  start): the executor's (the native module's where it has one, and its torch path
  apart) and the baseline's, to set against the loopback bandwidth;
- the loopback bandwidth of one 64 MiB send/recv, and the plan's estimate at that
  bandwidth (the plan's links all intra-node: estimate x 400 GB/s / measured), so that
  the planner's cost model can be compared with a real transport.
`--profile RANK` runs one more sync with that rank under cProfile and prints where its
main thread's CPU time went (own time per function and torch operation). Every run's
engine tensors are checked against the vLLM layout built from the full tensors; a
difference makes the exit status 1.
"""

import argparse
import datetime
import json
import multiprocessing
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time

_DEFAULT_MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8,
                  "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss():
    """Resets the process's peak resident size (Linux: 5 to clear_refs) and returns the
    resident size now, in KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS")


def _profiled_run(ex, destinations, profile):
    """One more sync of `ex`, under cProfile when `profile`: its seconds and the
    functions and torch operations that took the most of it (own time), as text."""
    import cProfile
    import io
    import pstats

    if destinations is not None:
        for v in destinations.values():
            v.zero_()
    if not profile:
        ex.run()
        return None
    # The main thread's CPU time, not wall time: with more ranks than cores a rank
    # waits for a core anywhere, and the transport runs in gloo's threads.
    profiler = cProfile.Profile(time.thread_time)
    start = time.perf_counter()
    profiler.enable()
    stats = ex.run()
    profiler.disable()
    seconds = time.perf_counter() - start
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
    lines = [line for line in text.getvalue().splitlines()
             if line.strip() and not line.startswith(("   Ordered", "         "))]
    return (f"rank {stats.rank}: one profiled sync {seconds:.3f} s, its main thread's CPU "
            f"time below (of the fp8 transfers "
            f"it received, {stats.quantized_at_sender} came quantised, "
            f"{stats.quantized_at_destination} were quantised here)\n" + "\n".join(lines))


def _quantizer_gb_per_s(module_path=None, torch_path=False):
    """The fp8 quantiser's throughput on one core, in GB/s of bf16 input: the best of 5
    quantize_block128 calls on a 2048 x 1024 bf16 tensor (in this process, before the
    ranks start), with this executor (`torch_path`: its torch path, the native module's
    quantiser turned off) or the one in `module_path`."""
    import torch

    from rlsched.weight_sync import executor

    module = _load_module("rlsched_executor_q", module_path) if module_path else executor
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    native = getattr(module, "_native_quantize_fn", None)
    if torch_path:
        module._native_quantize_fn = False
    try:
        x = torch.randn(2048, 1024, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            module.quantize_block128(x)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
        if torch_path:
            module._native_quantize_fn = native
    return x.numel() * 2 / best / 1e9


def _executor_at(revision):
    """The executor's source as of git `revision` (its path moved into the weight_sync
    subpackage; older revisions hold it at python/rlsched/executor.py)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in ("python/rlsched/weight_sync/executor.py", "python/rlsched/executor.py"):
        shown = subprocess.run(["git", "-C", here, "show", f"{revision}:{path}"],
                               capture_output=True)
        if shown.returncode == 0:
            return shown.stdout
    raise SystemExit(f"--baseline {revision}: no executor in that revision")


def _load_module(name, path):
    """The Python module in file `path`, imported as `name`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _rank_main(rank, world, cfg, results):
    import torch
    import torch.distributed as dist

    from rlsched.weight_sync import executor
    from rlsched.weight_sync import layouts as lay

    torch.set_num_threads(1)
    out = {"rank": rank}
    try:
        dist.init_process_group("gloo", store=dist.FileStore(cfg["store"], world), rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=300))
        model, train, infer, full = cfg["model"], cfg["train"], cfg["infer"], cfg["full"]
        T, E = train.world, infer.tp * infer.replicas
        sources = lay.megatron_shards(model, train, rank, full) if rank < T else {}
        engine = rank if cfg["colocated"] else rank - T
        reference = destinations = None
        if 0 <= engine < E:
            reference = lay.vllm_shards(model, infer, engine % infer.tp, full)
            if cfg["fp8"]:
                for name in [n for n in reference if lay.is_linear(n)]:
                    reference[name], reference[executor.scale_name(name)] = (
                        executor.quantize_block128(reference[name]))
            destinations = {k: torch.zeros_like(v) for k, v in reference.items()}
            for v in destinations.values():
                v.fill_(0)  # touch the pages: ru_maxrss should count staging alone
        plan = executor.load_plan(cfg["plan"], rank)

        def slowest(seconds):
            t = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t[0])

        def total(seconds):
            t = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(t)
            return float(t[0])

        # The loopback link: one 64 MiB send from rank 0 to rank 1.
        link = torch.empty(64 << 20, dtype=torch.uint8)
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(link, dst=1)
        elif rank == 1:
            dist.recv(link, src=0)
        link_seconds = slowest(time.perf_counter() - start if rank in (0, 1) else 0.0)
        del link

        def plain(module, plan):
            """Plain broadcasts: the collectives `module`'s executor issues for `plan`
            (sizes, groups, order) on buffers allocated once, nothing packed or
            unpacked; returns the function that runs them and its collective count."""
            buckets = [[c for c in cs
                        if c.kind != "local" and (rank == c.src or rank in c.dst_ranks)]
                       for cs in module.schedule(plan.transfers, cfg["direct_min_bytes"])]
            every = [None] * world
            dist.all_gather_object(every, sorted({c.members for cs in buckets for c in cs
                                                  if c.kind == "broadcast"}))
            groups = {}
            for members in sorted({tuple(m) for g in every for m in g}):
                pg = dist.new_group(list(members))
                if rank in members:
                    groups[members] = pg
            buffers = [[torch.empty(c.size, dtype=torch.uint8) for c in cs] for cs in buckets]

            def run():
                start = time.perf_counter()
                for cs, bufs in zip(buckets, buffers):
                    works = []
                    for c, buf in zip(cs, bufs):
                        if c.kind == "p2p":  # an older executor tags by the first transfer
                            tag = getattr(c, "tag", c.transfers[0].index)
                            works.append(dist.isend(buf, dst=c.receivers[0], tag=tag)
                                         if rank == c.src else dist.irecv(buf, src=c.src, tag=tag))
                        else:
                            works.append(dist.broadcast(buf, src=c.src, group=groups[c.members],
                                                        async_op=True))
                    for w in works:
                        w.wait()
                return time.perf_counter() - start

            return run, sum(len(cs) for cs in buckets)

        plain_runs = {"plain": plain(executor, plan)}

        # Set up once (checks, process groups): this executor, and the baseline's.
        dist.barrier()
        before = _reset_peak_rss()
        ex = executor.Executor(plan, sources=sources, destinations=destinations,
                               dtype=model.dtype, direct_min_bytes=cfg["direct_min_bytes"])
        setup_growth = _status_kib("VmHWM") - before
        setup = slowest(ex.setup_seconds)
        variants = [("executor", ex), ("plain", None)]
        base = None
        if cfg["keep_staging"]:  # the same, its staging buffer kept between syncs
            variants.insert(1, ("kept", executor.Executor(
                plan, sources=sources, destinations=destinations, dtype=model.dtype,
                direct_min_bytes=cfg["direct_min_bytes"], keep_staging=True)))
        if cfg["baseline"]:
            base = _load_module("rlsched_executor_baseline", cfg["baseline"])
            base_plan = base.load_plan(cfg["plan"], rank)
            variants.insert(1, ("baseline", base.Executor(
                base_plan, sources=sources, destinations=destinations, dtype=model.dtype,
                direct_min_bytes=cfg["direct_min_bytes"])))
            # The baseline's own plain broadcasts: its collectives may differ.
            plain_runs["baseline plain"] = plain(base, base_plan)
            variants.append(("baseline plain", None))

        # REPEAT rounds, each one sync of every variant, in an order that rotates.
        times = {name: [] for name, _ in variants}
        cpu_seconds = {name: [] for name, _ in variants}  # all ranks' user + system time
        thread_seconds = {name: [] for name, e in variants if e is not None}  # main threads
        staging, rss_growth, mismatched = 0, 0, {}
        for turn in range(cfg["repeat"]):
            shift = turn % len(variants)
            for name, e in variants[shift:] + variants[:shift]:
                if destinations is not None and e is not None:
                    for v in destinations.values():
                        v.zero_()
                dist.barrier()
                cpu = time.process_time()
                if e is None:
                    times[name].append(slowest(plain_runs[name][0]()))
                    cpu_seconds[name].append(total(time.process_time() - cpu))
                    continue
                before = _reset_peak_rss()
                main_cpu = time.thread_time()
                stats = e.run()
                main_cpu = time.thread_time() - main_cpu
                cpu = time.process_time() - cpu
                thread_seconds[name].append(total(main_cpu))
                times[name].append(slowest(stats.transfer_seconds))
                cpu_seconds[name].append(total(cpu))
                if name == "executor":
                    rss_growth = max(rss_growth, _status_kib("VmHWM") - before)
                    staging = max(staging, stats.peak_staging_bytes)
                    direct, staged = stats.direct, stats.bytes_staged
                if reference is not None:
                    mismatched[name] = mismatched.get(name, 0) + sum(
                        int((lay.bits(destinations[k]) != lay.bits(v)).sum())
                        for k, v in reference.items())
        if cfg["profile"]:  # a sync is collective: every rank runs it, some profiled
            dist.barrier()
            profiled = _profiled_run(ex, destinations, rank in cfg["profile"])
            if rank in cfg["profile"]:
                out["profile"] = profiled
        out["mismatched"] = mismatched
        collectives = plain_runs["plain"][1]
        out.update(executor_seconds=min(times["executor"]), setup_seconds=setup,
                   plain_seconds=min(times["plain"]), times=times, cpu_seconds=cpu_seconds,
                   thread_seconds=thread_seconds,
                   setup_rss_growth_bytes=setup_growth * 1024,
                   staging=staging, rss_growth_bytes=rss_growth * 1024,
                   link_seconds=link_seconds, collectives=collectives, direct=direct,
                   staged=staged, baseline_collectives=(
                       plain_runs["baseline plain"][1] if base is not None else 0))
    except Exception as error:  # noqa: BLE001 - reported to the parent
        import traceback
        out["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=4)}"
    finally:
        results.put(out)
        if dist.is_initialized():
            dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--train", default="tp=2,pp=2")
    parser.add_argument("--infer", default="tp=2,replicas=2")
    parser.add_argument("--colocated", action="store_true")
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--target-dtype", default="bf16", choices=("bf16", "fp8_block128"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--direct-min-kib", type=int, default=1024,
                        help="transfers at least this large move alone, unstaged where "
                             "contiguous (0: pack every transfer)")
    parser.add_argument("--baseline", default=None, metavar="REV|FILE",
                        help="also time the executor as of this git revision "
                             "(or the executor module in FILE): its Executor on the same "
                             "world, alternating with this one and the plain broadcasts in "
                             "every round")
    parser.add_argument("--profile", type=int, action="append", default=[], metavar="RANK",
                        help="after the measured syncs, run one more under cProfile on this "
                             "rank and print where its time went (repeatable)")
    parser.add_argument("--rlsched", default=os.environ.get("RLSCHED_BIN", "build/rlsched"))
    parser.add_argument("--keep-staging", action="store_true",
                        help="also time an Executor that keeps its staging buffer (kept)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from rlsched.weight_sync import launcher as reshard_run
    from rlsched.weight_sync import layouts as lay

    workdir = tempfile.mkdtemp(prefix="rlsched-executor-bench-")
    try:
        model_path = args.model
        if model_path is None:
            model_path = os.path.join(workdir, "config.json")
            with open(model_path, "w") as f:
                json.dump(_DEFAULT_MODEL, f)
        train = reshard_run.parse_layout(args.train, reshard_run._TRAIN_KEYS, field="train")
        infer = reshard_run.parse_layout(args.infer, ("tp", "replicas"), flags=("ep",),
                                         field="infer")
        baseline = None
        if args.baseline and os.path.isfile(args.baseline):
            baseline = args.baseline
        elif args.baseline:
            baseline = os.path.join(workdir, "executor_baseline.py")
            with open(baseline, "wb") as f:
                f.write(_executor_at(args.baseline))
        plan_path = os.path.join(workdir, "plan.binpb")
        planned = reshard_run.plan_with_rlsched(args.rlsched, model_path, train, infer,
                                                args.colocated, args.bucket_mib, plan_path,
                                                target_dtype=args.target_dtype)
        with open(model_path) as f:
            model = lay.parse_config(f.read())
        t = lay.Train(**train)
        i = lay.Infer(tp=infer.get("tp", 1), replicas=infer.get("replicas", 1),
                      expert_parallel=bool(infer.get("ep", False)))
        T, E = t.world, i.tp * i.replicas
        world = max(T, E) if args.colocated else T + E
        cfg = {"store": os.path.join(workdir, "store"), "model": model, "train": t, "infer": i,
               "full": lay.full_tensors(model), "colocated": args.colocated, "plan": plan_path,
               "repeat": args.repeat, "profile": set(args.profile), "baseline": baseline,
               "fp8": args.target_dtype == "fp8_block128", "keep_staging": args.keep_staging,
               "direct_min_bytes": args.direct_min_kib << 10 if args.direct_min_kib else None}
        quantizer = {}
        if cfg["fp8"]:
            quantizer["executor"] = _quantizer_gb_per_s()
            from rlsched.weight_sync import executor
            if executor._native_quantize() is not None:  # the torch path, for comparison
                quantizer["executor torch path"] = _quantizer_gb_per_s(torch_path=True)
            if baseline:
                quantizer["baseline"] = _quantizer_gb_per_s(baseline)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(r, world, cfg, results), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        outs = []
        while len(outs) < world:
            try:
                outs.append(results.get(timeout=5))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("a rank died")
        for p in procs:
            p.join(timeout=30)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        print(errors[0], file=sys.stderr)
        return 1
    for o in sorted(outs, key=lambda o: o["rank"]):
        if "profile" in o:
            print(o["profile"], file=sys.stderr)
    o0 = outs[0]
    budget = args.bucket_mib << 20
    link_gbps = (64 << 20) / o0["link_seconds"] / 1e9
    estimate = float(planned["estimate_seconds"])
    bytes_moved = int(planned["bytes_moved"])
    mismatched = {}
    for o in outs:
        for name, n in o.get("mismatched", {}).items():
            mismatched[name] = mismatched.get(name, 0) + n
    r = {
        "ranks": world, "model_bytes": sum(v.numel() * v.element_size()
                                           for v in cfg["full"].values()),
        "bytes_moved": bytes_moved, "buckets": int(planned["num_buckets"]),
        "collectives": max(o["collectives"] for o in outs),
        "direct_collectives": max(o["direct"] for o in outs),
        "bytes_staged": max(o["staged"] for o in outs),
        "executor_seconds": o0["executor_seconds"], "plain_seconds": o0["plain_seconds"],
        "ratio": o0["executor_seconds"] / o0["plain_seconds"],
        "setup_seconds": o0["setup_seconds"],
        "bucket_budget_bytes": budget,
        "peak_staging_bytes": max(o["staging"] for o in outs),
        "peak_rss_growth_bytes": max(o["rss_growth_bytes"] for o in outs),
        "setup_rss_growth_bytes": max(o["setup_rss_growth_bytes"] for o in outs),
        "loopback_gb_per_s": link_gbps,
        "quantizer_gb_per_s": quantizer,
        "plan_estimate_seconds": estimate,
        "plan_estimate_at_loopback_seconds": estimate * 400.0 / link_gbps,
        "check_ok": not any(mismatched.values()),
        "mismatched_elements": mismatched,
        "rounds": o0["times"],
        "cpu_seconds": {k: min(v) for k, v in o0["cpu_seconds"].items()},
        "main_thread_cpu_seconds": {k: min(v) for k, v in o0["thread_seconds"].items()},
        "target_dtype": args.target_dtype,
    }
    if "kept" in o0["times"]:
        r["kept_seconds"] = min(o0["times"]["kept"])
        r["kept_ratio"] = r["kept_seconds"] / o0["plain_seconds"]
    if "baseline" in o0["times"]:
        r["baseline"] = args.baseline
        r["baseline_seconds"] = min(o0["times"]["baseline"])
        r["baseline_plain_seconds"] = min(o0["times"]["baseline plain"])
        r["baseline_collectives"] = max(o["baseline_collectives"] for o in outs)
        r["baseline_ratio"] = r["baseline_seconds"] / r["baseline_plain_seconds"]
        # This executor against the baseline's collectives (the same bytes, in as many
        # collectives as the baseline issued).
        r["ratio_to_baseline_plain"] = r["executor_seconds"] / r["baseline_plain_seconds"]
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print(f"world        {world} ranks, {r['model_bytes'] / 1e6:.0f} MB model "
              f"({args.target_dtype} engines), "
              f"{bytes_moved / 1e6:.0f} MB moved in {r['buckets']} buckets, "
              f"{r['collectives']} collectives on the busiest rank")
        print(f"executor     {r['executor_seconds']:.3f} s   plain broadcasts "
              f"{r['plain_seconds']:.3f} s   ratio {r['ratio']:.2f}x   (set-up "
              f"{r['setup_seconds']:.3f} s apart)")
        if "kept" in r:
            print(f"kept         {r['kept_seconds']:.3f} s   ratio {r['kept_ratio']:.2f}x "
                  "(keep_staging: the staging buffer kept between syncs)")
        if "baseline" in r:
            print(f"baseline     {r['baseline_seconds']:.3f} s   its plain broadcasts "
                  f"{r['baseline_plain_seconds']:.3f} s ({r['baseline_collectives']} "
                  f"collectives on the busiest rank)   ratio {r['baseline_ratio']:.2f}x "
                  f"(executor.py of {args.baseline}, in the same rounds); this executor "
                  f"against those {r['ratio_to_baseline_plain']:.2f}x")
        print("rounds       " + "; ".join(
            f"{name} " + " ".join(f"{t:.3f}" for t in ts) for name, ts in r["rounds"].items()))
        print(f"cpu          {os.cpu_count()} cores; one sync, all ranks' CPU seconds (least of "
              "the rounds): " + ", ".join(f"{k} {v:.3f}" for k, v in r["cpu_seconds"].items())
              + "; of which the ranks' main threads (packing, quantising, unpacking): "
              + ", ".join(f"{k} {v:.3f}" for k, v in r["main_thread_cpu_seconds"].items()))
        print(f"memory       peak staging {r['peak_staging_bytes'] / 2**20:.1f} MiB, peak RSS "
              f"growth {r['peak_rss_growth_bytes'] / 2**20:.1f} MiB per rank in a sync; bucket "
              f"budget {budget / 2**20:.0f} MiB (set-up: "
              f"{r['setup_rss_growth_bytes'] / 2**20:.1f} MiB)")
        if quantizer:
            print("quantiser    " + ", ".join(f"{k} {v:.2f}" for k, v in quantizer.items())
                  + " GB/s of bf16 in on one core (2048 x 1024); loopback link "
                  f"{link_gbps:.2f} GB/s")
        print(f"plan         estimate {estimate * 1e3:.3f} ms at 400 GB/s; loopback "
              f"{link_gbps:.2f} GB/s -> {r['plan_estimate_at_loopback_seconds']:.3f} s")
        print(f"check        {'ok' if r['check_ok'] else 'FAILED'} (mismatched elements: "
              + ", ".join(f"{k} {v}" for k, v in mismatched.items()) + ")")
    return 0 if r["check_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
