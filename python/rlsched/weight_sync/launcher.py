"""Launches a whole resharding world on one machine, runs the plan with the executor
(:mod:`rlsched.weight_sync.executor`) and, with ``--check``, compares every engine tensor with the
vLLM layout built independently from the full tensors (:mod:`rlsched.weight_sync.layouts`).

    /usr/bin/python3 -m rlsched.weight_sync.launcher --model config.json \\
        --train tp=2,pp=2,dp=2 --infer tp=2,replicas=2 [--colocated] [--backend gloo] \\
        [--target-dtype bf16|fp8] [--bucket-mib N] [--plan-format json|binpb] [--plan FILE] \\
        [--deliver tensors|callback] [--direct-min-kib K] [--syncs N] [--timeout S] \\
        [--fault-rank R --fault exit|stall] [--check] [--json]

It plans with ``rlsched reshard --plan-out`` (the program from ``--rlsched``, else
:func:`rlsched.find_program`: ``$RLSCHED_BIN``, the program shipped with the package,
``rlsched`` on ``PATH``) unless ``--plan`` gives a plan file,
builds deterministic full Hugging Face tensors, shards them into the trainer's
Megatron-core layout, forks one process per rank (trainer ranks ``0..T-1``, engine ranks
after them, or on the same ranks with ``--colocated``), joins them in one
``torch.distributed`` world (a file store in a temporary folder; gloo on loopback, or
NCCL) and executes. It prints one summary (``--json``: one JSON object): ranks, buckets,
collectives, bytes moved, seconds (the slowest rank's), the largest staging memory of a
rank, the plan's own estimate, and the check's result; for a plan refused before any
byte moved, ``refused`` (the problems every rank found: a plan part that does not read,
as a cut ``.binpb``, included) and ``refused_ranks``; for a world that failed,
``error`` (the first failed rank's, with its traceback) and ``errors`` (every failed
rank's, one line each). With ``--target-dtype fp8`` the
engines' linear weights are fp8 codes (uint8) with float32 block scales, and the check
compares them with the reference shards quantised by the same block-128 rule.

Exit status: 0 when the run (and the check) succeeded, 1 when the check found
differences, 2 for bad arguments, a plan that does not fit the world (refused before any
byte moved), or a world that failed (a rank's error or timeout, as ``--fault-rank``
provokes).
"""

from __future__ import annotations

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
import traceback
from typing import Dict, List, Mapping, Optional

from rlsched._program import ProgramNotFoundError, find_program
from rlsched.errors import ExecutorError, InvalidArgumentError, plain_message

# torch, the executor and its layouts are imported in the functions that use them: the
# command line's parsing and its errors need none.
_TRAIN_KEYS = ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "first_stage_layers",
               "last_stage_layers")
# At most this many differences are described in the check's result.
_MAX_CHECK_PROBLEMS = 10


def parse_layout(text: str, keys, flags=(), field="train") -> Dict[str, int]:
    """``tp=2,pp=2`` -> {"tp": 2, "pp": 2}; '-' in a key reads as '_'; `flags` are
    keys without a value (``ep`` in --infer), True when given."""
    out: Dict[str, int] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key in flags and not value:
            out[key] = True
            continue
        if key not in keys:
            raise InvalidArgumentError(f"{field}: unknown key {key!r} "
                                       f"(keys: {', '.join(tuple(keys) + tuple(flags))})",
                                       field)
        try:
            number = int(value)
        except ValueError:
            raise InvalidArgumentError(f"{field}.{key}: {value!r} is not an integer",
                                       f"{field}.{key}") from None
        if number < 1:
            raise InvalidArgumentError(f"{field}.{key}: must be >= 1, got {number}",
                                       f"{field}.{key}")
        out[key] = number
    return out


def _layout_arg(layout: Mapping[str, int]) -> str:
    parts = []
    for key, value in layout.items():
        if value is True:
            parts.append(key)
        elif value is not None and value is not False:
            parts.append(f"{key.replace('_', '-')}={value}")
    return ",".join(parts) or "tp=1"


def plan_with_rlsched(rlsched_bin: str, model_path: str, train: dict, infer: dict,
                      colocated: bool, bucket_mib: Optional[int], out_path: str,
                      round_robin_experts: bool = False, target_dtype: str = "bf16") -> dict:
    """Runs ``rlsched reshard --plan-out out_path --json``; returns its summary."""
    infer_arg = dict(infer)
    args = [rlsched_bin, "reshard", "--model", model_path, "--train", _layout_arg(train),
            "--infer", _layout_arg(infer_arg), "--plan-out", out_path, "--json"]
    if colocated:
        args.append("--colocated")
    if round_robin_experts:
        args.append("--round-robin-experts")
    if bucket_mib:
        args += ["--bucket-mib", str(bucket_mib)]
    if target_dtype != "bf16":
        args += ["--target-dtype", target_dtype]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InvalidArgumentError(f"rlsched reshard failed (exit {done.returncode}): "
                                   f"{done.stderr.strip() or done.stdout.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load_part(executor, path: str, rank: int):
    """This rank's part of the plan file; when it does not read (a cut ``.binpb``), every
    rank is refused with this rank's cause (:func:`rlsched.weight_sync.executor.refuse_plan`: the
    others are in their Executors' first collective) instead of failing on its closed
    connection."""
    try:
        return executor.load_plan(path, rank)
    except (ValueError, OSError) as error:
        executor.refuse_plan(rank, "plan", f"{os.path.basename(path)}: "
                             f"{plain_message(error)}")


def _rank_main(rank: int, world: int, cfg: dict, results) -> None:
    """One rank's process: init the world, build its tensors, execute, check."""
    import torch
    import torch.distributed as dist

    from rlsched.weight_sync import executor
    from rlsched.weight_sync import layouts as lay

    torch.set_num_threads(1)
    out: dict = {"rank": rank}
    try:
        dist.init_process_group(cfg["backend"], store=dist.FileStore(cfg["store"], world),
                                rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=cfg["timeout"]))
        model, train, infer, full = cfg["model"], cfg["train"], cfg["infer"], cfg["full"]
        trainer_ranks = train.world
        engine_ranks = infer.tp * infer.replicas
        sources = lay.megatron_shards(model, train, rank, full) if rank < trainer_ranks else {}
        engine = rank if cfg["colocated"] else rank - trainer_ranks
        reference, destinations, on_slice = None, None, None
        if 0 <= engine < engine_ranks:
            reference = lay.vllm_shards(model, infer, engine % infer.tp, full)
            if cfg["fp8"]:  # linear weights as fp8 bits + block scales, quantised here
                for name in [n for n in reference if lay.is_linear(n)]:
                    codes, scales = executor.quantize_block128(reference[name])
                    reference[name] = codes
                    reference[executor.scale_name(name)] = scales
            destinations = {k: torch.zeros_like(v) for k, v in reference.items()}
            if cfg["deliver"] == "callback":
                target, destinations = destinations, None

                def on_slice(name, tensor, dst_slice, target=target):
                    target[name][tuple(slice(b, e) for b, e in dst_slice)].copy_(tensor)

        plan = _load_part(executor, cfg["plan"], rank)
        # With several syncs the earlier ones move other weights: every element's lowest
        # bit flipped, in place, before the Executor is made (as an earlier train step's
        # weights); the flip is undone before the last sync, which the check sees.
        if cfg["syncs"] > 1:
            for tensor in sources.values():
                lay.bits(tensor).bitwise_xor_(1)
        ex = executor.Executor(plan, sources=sources, destinations=destinations,
                               on_slice=on_slice, dtype=model.dtype,
                               direct_min_bytes=cfg["direct_min_bytes"],
                               timeout=datetime.timedelta(seconds=cfg["timeout"]),
                               layout=cfg["layout"], keep_staging=cfg["keep_staging"])
        if rank == cfg["fault_rank"]:  # fault injection, before the sync
            if cfg["fault"] == "stall":  # alive, silent past the others' timeout
                time.sleep(cfg["timeout"] + 1.0)
            results.put({"rank": rank, "fault": cfg["fault"]})
            results.close()
            results.join_thread()
            os._exit(0)
        sync_start = time.perf_counter()
        for sync in range(cfg["syncs"]):
            if sync == cfg["syncs"] - 1 and sync > 0:
                for tensor in sources.values():
                    lay.bits(tensor).bitwise_xor_(1)
            stats = ex.run()
        out["stats"] = stats.as_dict()
        if cfg["check"] and reference is not None:
            got = destinations if destinations is not None else target
            problems: List[str] = []
            mismatched, elements = 0, 0
            for name, want in reference.items():
                elements += want.numel()
                have = got[name]
                diff = int((lay.bits(have) != lay.bits(want)).sum())
                if diff:
                    mismatched += diff
                    if len(problems) < _MAX_CHECK_PROBLEMS:
                        problems.append(f"rank {rank} (engine tp rank {engine % infer.tp}): "
                                        f"{name} {list(want.shape)}: {diff} element(s) differ")
            out["check"] = {"tensors": len(reference), "elements": elements,
                            "mismatched_elements": mismatched, "problems": problems}
    except executor.PlanMismatchError as error:
        out["refused"] = str(error)
    except Exception as error:  # any: reported to the launcher
        out["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=4)}"
        if "sync_start" in locals():
            out["seconds_to_error"] = time.perf_counter() - sync_start
    finally:
        results.put(out)
        if dist.is_initialized():
            dist.destroy_process_group()


def run(model_path: str, train: Dict[str, int], infer: Mapping[str, int],
        colocated: bool = False, backend: str = "gloo", check: bool = False,
        plan_path: Optional[str] = None, bucket_mib: Optional[int] = None,
        plan_format: str = "json", rlsched_bin: Optional[str] = None,
        deliver: str = "tensors", timeout: float = 120.0,
        direct_min_bytes: Optional[int] = None, syncs: int = 1,
        target_dtype: str = "bf16", fault_rank: Optional[int] = None,
        fault: str = "exit", keep_staging: bool = False) -> dict:
    """Plans (unless `plan_path`), launches the world, executes, checks; returns the
    summary (see the module's docstring). `direct_min_bytes`: the executor's threshold
    for moving a transfer alone (None: its default, 0: pack every transfer). `syncs`:
    the plan runs this many times on one Executor per rank, all but the last sync on
    other source contents (changed in place; the check sees the last sync).
    `keep_staging`: the executors keep their staging buffer between syncs.
    `fault_rank`: fault injection: after the set-up, that rank exits (`fault` "exit") or
    stays silent past the timeout ("stall") instead of syncing; the others must fail,
    within `timeout` seconds (the collectives' timeout)."""
    from rlsched.weight_sync import executor
    from rlsched.weight_sync import layouts as lay

    if backend not in ("gloo", "nccl"):
        raise InvalidArgumentError(f"backend: {backend!r} is not gloo or nccl", "backend")
    if plan_format not in ("json", "binpb"):
        raise InvalidArgumentError(f"plan_format: {plan_format!r} is not json or binpb",
                                   "plan_format")
    if deliver not in ("tensors", "callback"):
        raise InvalidArgumentError(f"deliver: {deliver!r} is not tensors or callback",
                                   "deliver")
    if syncs < 1:
        raise InvalidArgumentError(f"syncs: must be >= 1, got {syncs}", "syncs")
    if fault not in ("exit", "stall"):
        raise InvalidArgumentError(f"fault: {fault!r} is not exit or stall", "fault")
    target_dtype = {"fp8": "fp8_block128"}.get(target_dtype, target_dtype)
    if target_dtype not in ("bf16", "fp8_block128"):
        raise InvalidArgumentError(f"target_dtype: {target_dtype!r} is not bf16 or "
                                   "fp8_block128 (fp8)", "target_dtype")
    with open(model_path, "r", encoding="utf-8") as f:
        model = lay.parse_config(f.read())
    t = lay.Train(**{k: v for k, v in train.items()})
    i = lay.Infer(tp=int(infer.get("tp", 1)), replicas=int(infer.get("replicas", 1)),
                  expert_parallel=bool(infer.get("ep", False)),
                  round_robin_experts=bool(infer.get("round_robin_experts", False)))
    trainer_ranks, engine_ranks = t.world, i.tp * i.replicas
    world = max(trainer_ranks, engine_ranks) if colocated else trainer_ranks + engine_ranks
    workdir = tempfile.mkdtemp(prefix="rlsched-reshard-run-")
    summary: dict = {"syncs": syncs, "target_dtype": target_dtype, "ranks": world,
                     "trainer_ranks": trainer_ranks, "engine_ranks": engine_ranks,
                     "colocated": colocated, "backend": backend}
    try:
        planned = None
        if plan_path is None:
            if not rlsched_bin:
                try:
                    rlsched_bin = find_program()
                except ProgramNotFoundError as error:
                    raise InvalidArgumentError(f"{plain_message(error)}; or pass --rlsched",
                                               "rlsched_bin") from error
            plan_path = os.path.join(workdir, "plan." + plan_format)
            infer_arg = {"tp": i.tp, "replicas": i.replicas, "ep": i.expert_parallel}
            planned = plan_with_rlsched(rlsched_bin, model_path, train, infer_arg, colocated,
                                        bucket_mib, plan_path, i.round_robin_experts,
                                        target_dtype)
        part = executor.load_plan(plan_path, 0)
        summary["plan"] = {k: part.summary.get(k) for k in (
            "num_transfers", "num_buckets", "bytes_moved", "bytes_local", "bytes_received",
            "estimate_seconds", "lower_bound_seconds", "naive_seconds")}
        for key, value in list(summary["plan"].items()):
            if isinstance(value, str):
                summary["plan"][key] = int(value)
        if planned is not None:
            summary["plan"]["busiest_link"] = planned.get("busiest_link")
        cfg = {"backend": backend, "store": os.path.join(workdir, "store"), "timeout": timeout,
               "model": model, "train": t, "infer": i, "full": lay.full_tensors(model),
               "colocated": colocated, "plan": plan_path, "check": check, "deliver": deliver,
               "syncs": syncs, "fp8": target_dtype == "fp8_block128", "fault_rank": fault_rank,
               "fault": fault, "keep_staging": keep_staging,
               "layout": executor.world_layout(t, i, colocated, target_dtype),
               "direct_min_bytes": (executor.DIRECT_MIN_BYTES if direct_min_bytes is None
                                    else direct_min_bytes or None)}
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        start = time.perf_counter()
        procs = [ctx.Process(target=_rank_main, args=(r, world, cfg, results), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        outs: List[dict] = []
        deadline = time.monotonic() + timeout + 30
        while len(outs) < world:
            try:
                outs.append(results.get(timeout=1.0))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    for p in procs:
                        if p.is_alive():
                            p.kill()
                    what = (f"rank {procs.index(dead[0])} exited with status {dead[0].exitcode}"
                            if dead else f"no result within {timeout + 30:.0f} s")
                    raise ExecutorError(f"the world failed: {what}")
        for p in procs:
            p.join(timeout=30)
        summary["wall_seconds"] = time.perf_counter() - start
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    outs.sort(key=lambda o: o["rank"])
    if fault_rank is not None:
        summary["fault"] = {"rank": fault_rank, "kind": fault,
                            "failed_ranks": [o["rank"] for o in outs if "error" in o],
                            "max_seconds_to_error": max(
                                (o.get("seconds_to_error", 0.0) for o in outs), default=0.0)}
    errors = [o["error"] for o in outs if "error" in o]
    refused = [o["refused"] for o in outs if "refused" in o]
    if errors:
        summary["error"] = errors[0]
        # Every failed rank's error in one line each: the first is often a peer's closed
        # connection, the cause another rank's.
        summary["errors"] = [f"rank {o['rank']}: {o['error'].splitlines()[0]}"
                             for o in outs if "error" in o]
        summary["ok"] = False
        return summary
    if refused:
        summary["refused"] = refused[0]
        summary["refused_ranks"] = [o["rank"] for o in outs if "refused" in o]
        summary["ok"] = False
        return summary
    stats = [o["stats"] for o in outs if "stats" in o]
    summary.update({
        "buckets": max(s["buckets"] for s in stats),
        "collectives": sum(s["collectives"] for s in stats if s["bytes_sent"]),
        "direct_collectives": sum(s["direct"] for s in stats if s["bytes_sent"]),
        "bytes_staged": sum(s["bytes_staged"] for s in stats),
        "quantized_at_sender": sum(s["quantized_at_sender"] for s in stats),
        "quantized_at_destination": sum(s["quantized_at_destination"] for s in stats),
        "process_groups": stats[0]["groups"],
        "bytes_moved": sum(s["bytes_sent"] for s in stats),
        "bytes_received": sum(s["bytes_received"] for s in stats),
        "bytes_local": sum(s["bytes_local"] for s in stats),
        "seconds": max(s["transfer_seconds"] for s in stats),
        "setup_seconds": max(s["check_seconds"] for s in stats),
        "peak_staging_bytes": max(s["peak_staging_bytes"] for s in stats),
        # By the last sync, summed over the ranks (0 with keep_staging after the first).
        "staging_allocated_bytes": sum(s["staging_allocated_bytes"] for s in stats),
    })
    ok = True
    if check:
        checks = [o["check"] for o in outs if "check" in o]
        mismatched = sum(c["mismatched_elements"] for c in checks)
        problems = [p for c in checks for p in c["problems"]][:_MAX_CHECK_PROBLEMS]
        ok = mismatched == 0 and len(checks) == engine_ranks
        summary["check"] = {"ok": ok, "engine_ranks": len(checks),
                            "tensors": sum(c["tensors"] for c in checks),
                            "elements": sum(c["elements"] for c in checks),
                            "mismatched_elements": mismatched, "problems": problems}
    summary["ok"] = ok
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m rlsched.weight_sync.launcher",
        description="Run a weight-resharding plan on one machine: one process per rank, "
                    "torch.distributed, and optionally check every engine tensor byte for byte.")
    parser.add_argument("--model", required=True, help="the model's Hugging Face config.json")
    parser.add_argument("--train", required=True,
                        help="trainer layout: tp, pp, vpp, ep, etp, cp, dp, first-stage-layers, "
                             "last-stage-layers (e.g. tp=2,pp=2)")
    parser.add_argument("--infer", required=True,
                        help="engine layout: tp, replicas, and ep (no value) for expert "
                             "parallelism")
    parser.add_argument("--round-robin-experts", action="store_true")
    parser.add_argument("--colocated", action="store_true")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--target-dtype", default="bf16", choices=("bf16", "fp8", "fp8_block128"),
                        help="what the engines run: bf16, or fp8_block128 (fp8): linear weights "
                             "as fp8 e4m3 bits (uint8) with float32 scales per 128 x 128 block")
    parser.add_argument("--bucket-mib", type=int, default=None)
    parser.add_argument("--plan", default=None, help="execute this plan file instead of planning")
    parser.add_argument("--plan-format", default="json", choices=("json", "binpb"),
                        help="the plan file rlsched writes (binpb: each rank reads its own part)")
    parser.add_argument("--deliver", default="tensors", choices=("tensors", "callback"),
                        help="engine ranks receive into preallocated tensors or through a callback")
    parser.add_argument("--direct-min-kib", type=int, default=None,
                        help="transfers at least this large move in a collective of their own, "
                             "unstaged where contiguous (default 1024; 0: pack every transfer)")
    parser.add_argument("--rlsched", default=None,
                        help="the rlsched program (else $RLSCHED_BIN, the package's own, "
                        "or PATH's)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a collective may wait (the process group's timeout)")
    parser.add_argument("--syncs", type=int, default=1,
                        help="run the plan this many times (one set-up), all but the last sync "
                             "on other trainer tensor contents (changed in place)")
    parser.add_argument("--fault-rank", type=int, default=None,
                        help="fault injection: this rank exits (or stalls) after the set-up "
                             "instead of syncing; the others must fail within --timeout")
    parser.add_argument("--fault", default="exit", choices=("exit", "stall"))
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        train = parse_layout(args.train, _TRAIN_KEYS, field="train")
        infer = parse_layout(args.infer, ("tp", "replicas"), flags=("ep",), field="infer")
        if args.round_robin_experts:
            infer["round_robin_experts"] = True
        summary = run(args.model, train, infer, colocated=args.colocated, backend=args.backend,
                      check=args.check, plan_path=args.plan, bucket_mib=args.bucket_mib,
                      plan_format=args.plan_format, rlsched_bin=args.rlsched,
                      deliver=args.deliver, timeout=args.timeout, syncs=args.syncs,
                      target_dtype=args.target_dtype, fault_rank=args.fault_rank,
                      fault=args.fault,
                      direct_min_bytes=(None if args.direct_min_kib is None
                                        else args.direct_min_kib << 10))
    except (ValueError, OSError, RuntimeError) as error:
        print(f"reshard_run: {plain_message(error)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print_text(summary)
    if "refused" in summary or "error" in summary:
        if not args.json:
            print(summary.get("refused") or summary.get("error"), file=sys.stderr)
            if len(summary.get("errors", ())) > 1:
                print("every failed rank:\n  " + "\n  ".join(summary["errors"]),
                      file=sys.stderr)
        return 2
    return 0 if summary["ok"] else 1


def _duration(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.3f} µs"


def _print_text(s: dict) -> None:
    where = "colocated" if s["colocated"] else "separate"
    print(f"world          {s['ranks']} ranks ({s['trainer_ranks']} trainer, {s['engine_ranks']} "
          f"engine, {where}), {s['backend']}")
    if "buckets" in s:
        print(f"moved          {s['bytes_moved']} bytes over links, {s['bytes_local']} copied "
              f"locally; {s['buckets']} buckets, {s['collectives']} collectives, "
              f"{s['process_groups']} process groups")
        print(f"time           {_duration(s['seconds'])} (slowest rank), set-up "
              f"{_duration(s['setup_seconds'])}; peak staging {s['peak_staging_bytes']} bytes")
    p = s.get("plan") or {}
    if p:
        print(f"plan estimate  {_duration(p['estimate_seconds'])} (lower bound "
              f"{_duration(p['lower_bound_seconds'])}), {p['num_transfers']} transfers")
    f = s.get("fault")
    if f:
        print(f"fault          rank {f['rank']} ({f['kind']}): ranks {f['failed_ranks']} failed, "
              f"within {_duration(f['max_seconds_to_error'])}")
    c = s.get("check")
    if c:
        verdict = "ok" if c["ok"] else "FAILED"
        print(f"check          {verdict}: {c['tensors']} engine tensors, {c['elements']} elements, "
              f"{c['mismatched_elements']} differ")
        for problem in c["problems"]:
            print(f"  {problem}")


if __name__ == "__main__":
    sys.exit(main())
