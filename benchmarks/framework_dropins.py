"""Each RL framework's own balancing decision against rlsched's drop-in for it
(rlsched.integrations.{verl,slime,nemo_rl,areal}), on the same inputs, in the same run.

    PYTHONPATH=python:build/python /usr/bin/python3 benchmarks/framework_dropins.py \
        --verl CO/verl --slime CO/slime --nemo-rl CO/nemo_rl --areal CO/areal \
        [--seeds 5] [--big-seeds 3] [--quick] [--all]

Each option names the root of a checkout of that framework at the commit its drop-in
was written for (verl 1dda039b9, slime 624b824a8, NeMo-RL 7ea279abf, AReaL cbff54d64);
the files read are verl/utils/seqlen_balancing.py; slime/utils/{dp_schedule,
seqlen_balancing,flops_utils}.py; nemo_rl/data/packing/algorithms.py;
areal/utils/seqpack.py. None of that code is in this repository: it is compiled from
the checkout at run time (verl's functions picked out with `ast`, as
benchmarks/verl_dropins.py does; the other files loaded as modules under private
names; AReaL's with a stand-in `numba` whose njit returns the function — the two
allocators compared are plain Python at that commit either way — and a shim for
areal.utils.logging that also counts kk_allocate's falls back to FFD). A framework
left out is reported as not available and its drop-in runs alone.

The decisions compared, one table row each (calls as at the upstream call sites named
in the drop-ins' docstrings):

* verl `micro`: `rearrange_micro_batches(batch, cap)` of each rank (verl's own function,
  compiled from the checkout, with verl's tensordict selection stubbed out, against
  the drop-in). The batch is a stand-in that holds only what both read: `input_ids`
  (not nested), `attention_mask`'s width (the rank's longest sequence) and row sums (the
  lengths); indexing it is free on both sides, so neither pays for tensor copies.
  No dp_group (each rank's own count, on both sides). The ranks are verl's driver
  split of the batch (below), the same for both sides.
* verl `split`: the driver's `get_seqlen_balanced_partitions(calculate_workload(lengths),
  k_partitions=ranks, equal_size=True)` (ray_trainer.py:1235) against the drop-in, on
  the workloads as a list of ints (the driver passes the int64 tensor, which makes
  verl's function about 10x slower: measured once, printed under the table). Its step
  columns are each side's whole pipeline: its split, then its own micro-batching.
* slime `first-fit`, `balance_data`, `flops`: `build_dp_schedule(args, config, lengths,
  global_batch_size=groups, rollout_indices=group ids)` — one step, every rank planned
  at once — with dynamic batching (max_tokens_per_gpu = cap, cp 1, vpp 1) and
  balance_data / balance_by_flops off/off, on/off, on/on, a Llama-3-8B shape for slime's
  FLOPs (hidden 4096, 32 heads, 8 KV groups, kv_channels 128, FFN 14336, vocabulary
  128256, 32 layers). slime's balance_by_flops path is a Karmarkar-Karp over n
  sequences into K = ceil(tokens / cap) micro-batches, which builds n·K sets: slime's
  is not run above 4M sets (3.7M took 4.4 s and 0.8 GB here; --all runs it anyway),
  the drop-in is.
* NeMo-RL `mffd`: `get_packer("modified_first_fit_decreasing", cap, min_bin_count=ranks,
  bin_count_multiple=ranks).pack(lengths)` against the drop-in's `pack(lengths, cap,
  ranks, ranks)`, the bins dealt to the ranks round-robin (rank s: bins[s::ranks]), as
  batched_data_dict.py does; no padding multiple.
* AReaL `redistribute`: `kk_allocate(group tokens, capacity=int(1e12),
  min_groups=ranks)` (dist_rollout.py:79; a trajectory is a GRPO group, rank r takes
  group r). Its step columns are each side's whole pipeline: its redistribution, then
  its own micro-batching (kk).
* AReaL `kk mbs` and `ffd mbs`: `kk_allocate(lens, cap, min_groups=1, n_groups_divisor=1)`
  and `ffd_allocate(...)` (AReaL's default) of each rank (data.py:468, lens a numpy int64
  array, MicroBatchSpec's defaults), against the drop-in `kk_allocate`; no count
  agreement across ranks (both sides). The ranks are AReaL's kk redistribution, the
  same for both sides.

Without a framework's checkout its rows use the drop-in's split for the per-rank rows
and slime's balance_data and flops rows are skipped (with either setting the drop-in's
cost is slime's FLOPs function, read from the checkout).

Inputs (GRPO groups of 16 sequences, contiguous in the batch): the shipped length data
tests/data/rollout_lengths_amc23_llama3b.csv (amc23: each group's 16 lengths drawn,
with replacement, from one prompt's 50, the prompt drawn at random) and
tests/data/reasoning_lengths_intellect3_math.csv (intellect3: every length drawn from
the 42, long-tailed); and synthetic: prompt uniform in [100, 500] + response
log-normal(6.67, 1.15) clipped at 32,768 — each seeded, 4,096 and 16,384 sequences,
over 8, 64 and 256 data-parallel ranks (--quick: 1,024 sequences over 8 and 64).
The token cap per micro-batch is 32,768, raised where an input can hold a longer
sequence (verl asserts, NeMo-RL and AReaL raise on one) to that length rounded up to
1,024: amc23 32,768, intellect3 51,200 (longest 50,933), synthetic 33,792 (longest
500 + 32,768); the same cap for both sides.

Measures, per row: time of one call of each side (per-rank rows: the step's calls
divided by the ranks), the median over the seeds, both sides timed in the same loop,
alternating which goes first (gc collected before each whole-step call and before
each step's per-rank calls; every pair run once untimed on a 512-sequence batch
first); the predicted step time
under rlsched.plan_step's cost model: a rank's time is Σ over its micro-batches
(empty ones too) of (cost + overhead) + (p − 1)·max with p = 1 pipeline stage, the cost
of a micro-batch its tokens, the overhead the `overhead` field of
rlsched.plan_step(lengths, num_ranks=ranks, max_token_len=cap) on the same batch; the
step time is the slowest rank's. The cost is tokens in every row, also in slime's
balance_data and flops rows, where the drop-in minimises slime's FLOPs instead.
Columns: the framework's median step time, the
drop-in's over the framework's (worst seed), the seeds on which the drop-in's is <= the
framework's, the largest micro-batch's tokens, micro-batches over the cap and empty
ones (summed over the seeds), and the micro-batches of the step (median). Every plan
is checked to hold every sequence once. Seeds: --seeds (5) at up to 4,096 sequences,
--big-seeds (3) at 16,384, to keep the default run under about ten minutes on two
cores (verl's and AReaL's Python Karmarkar-Karp take 11-14 s for the 8 ranks' calls
of one 16,384-sequence intellect3 step).

Verdict per framework: whether on every seed of every row the drop-in's predicted step
time is <= the framework's and none of its micro-batches is over the cap; and the
speed ratio (framework's median time / the drop-in's) at 16,384 sequences, against the
target of at least 10x.
"""

import argparse
import ast
import csv
import gc
import heapq
import importlib.util
import logging
import os
import random
import statistics
import sys
import time
import types
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "tests", "data")
GROUP = 16
BASE_CAP = 32768
FLOPS_KK_SET_LIMIT = 4_000_000
MODEL = dict(hidden_size=4096, num_attention_heads=32, num_query_groups=8, kv_channels=128,
             ffn_hidden_size=14336, vocab_size=128256, num_layers=32, num_experts=None)


# ----------------------------------------------------------------------------------
# Upstream functions, compiled from the checkouts at run time


def _functions_from(path, wanted, namespace):
    """The top-level functions `wanted` of the file `path`, compiled into `namespace`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    nodes = [node for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name in wanted]
    missing = set(wanted) - {node.name for node in nodes}
    if missing:
        sys.exit(f"{path}: does not define {sorted(missing)}")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), path, "exec"), namespace)
    return namespace


def _module_from(name, path, stand_ins=()):
    """The file `path` executed as a module named `name`, with `stand_ins` (name,
    module) in sys.modules while it imports (put back afterwards)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    saved = {key: sys.modules.get(key) for key, _ in stand_ins}
    sys.modules.update(dict(stand_ins))
    try:
        spec.loader.exec_module(module)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return module


def _package(name):
    module = types.ModuleType(name)
    module.__path__ = []
    return module


def load_verl(root):
    import torch
    namespace = {
        "heapq": heapq, "torch": torch, "dist": torch.distributed,
        # verl's tensordict selection and device lookup: stubs (the benchmark compares
        # decisions; the drop-in's selection of the stand-in batch is free too)
        "tu": SimpleNamespace(index_select_tensor_dict=lambda batch, indices: None),
        "get_device_name": lambda: "cpu",
    }
    _functions_from(os.path.join(root, "verl", "utils", "seqlen_balancing.py"),
                    ["calculate_workload", "karmarkar_karp", "get_seqlen_balanced_partitions",
                     "ceildiv", "roundup_divisible", "rearrange_micro_batches"], namespace)
    return SimpleNamespace(**{k: namespace[k] for k in (
        "calculate_workload", "get_seqlen_balanced_partitions", "rearrange_micro_batches")})


def load_slime(root):
    directory = os.path.join(root, "slime", "utils")
    flops = _module_from("slime.utils.flops_utils", os.path.join(directory, "flops_utils.py"))
    balancing = _module_from("_slime_seqlen_balancing",
                             os.path.join(directory, "seqlen_balancing.py"))
    schedule = _module_from("_slime_dp_schedule", os.path.join(directory, "dp_schedule.py"), [
        ("slime", _package("slime")), ("slime.utils", _package("slime.utils")),
        ("slime.utils.flops_utils", flops), ("slime.utils.seqlen_balancing", balancing)])
    # the drop-in reads slime's FLOPs function from sys.modules (or imports it)
    sys.modules["slime.utils.flops_utils"] = flops
    return schedule


def load_nemo_rl(root):
    return _module_from("_nemo_rl_packing_algorithms",
                        os.path.join(root, "nemo_rl", "data", "packing", "algorithms.py"))


class _CountFallbacks(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        if "falling back to FFD" in record.getMessage():
            self.count += 1


AREAL_FALLBACKS = _CountFallbacks()


def load_areal(root):
    numba = types.ModuleType("numba")
    numba.njit = lambda function=None, **_: function if function else (lambda f: f)
    shim = types.ModuleType("areal.utils.logging")
    shim.getLogger = lambda name=None, *_, **__: logging.getLogger(f"areal.{name}")
    utils = _package("areal.utils")
    utils.logging = shim
    module = _module_from("_areal_seqpack", os.path.join(root, "areal", "utils", "seqpack.py"), [
        ("numba", numba), ("areal", _package("areal")), ("areal.utils", utils),
        ("areal.utils.logging", shim)])
    logger = logging.getLogger("areal.SeqPack")
    logger.addHandler(AREAL_FALLBACKS)
    logger.propagate = False
    return module


# ----------------------------------------------------------------------------------
# Inputs


def _read(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _length(row):
    return int(row["prompt_tokens"]) + int(row["response_tokens"])


class Inputs:
    def __init__(self):
        self.amc23 = {}
        for row in _read("rollout_lengths_amc23_llama3b.csv"):
            self.amc23.setdefault(row["group"], []).append(_length(row))
        self.prompts = sorted(self.amc23)
        self.intellect3 = [_length(row) for row in _read("reasoning_lengths_intellect3_math.csv")]
        longest = {"amc23": max(max(v) for v in self.amc23.values()),
                   "intellect3": max(self.intellect3), "synthetic": 500 + 32768}
        self.cap = {name: max(BASE_CAP, -(-value // 1024) * 1024)
                    for name, value in longest.items()}

    def lengths(self, name, n, seed):
        rng = random.Random(f"{name}/{n}/{seed}")
        if name == "amc23":
            out = []
            for _ in range(n // GROUP):
                responses = self.amc23[rng.choice(self.prompts)]
                out.extend(rng.choice(responses) for _ in range(GROUP))
            return out
        if name == "intellect3":
            return [rng.choice(self.intellect3) for _ in range(n)]
        return [rng.randint(100, 500) + min(32768, int(rng.lognormvariate(6.67, 1.15)))
                for _ in range(n)]


# ----------------------------------------------------------------------------------
# Plans: [rank][micro-batch] -> global indices; scored with rlsched's cost model


def evaluate(plan, lengths, cap, overhead, what):
    seen = sorted(i for rank in plan for micro_batch in rank for i in micro_batch)
    if seen != list(range(len(lengths))):
        raise AssertionError(f"{what}: the plan does not hold every sequence once")
    tokens = [[sum(lengths[i] for i in mb) for mb in rank] for rank in plan]
    flat = [t for rank in tokens for t in rank]
    return {"step": max(sum(t + overhead for t in rank) for rank in tokens),
            "largest": max(flat), "over": sum(t > cap for t in flat),
            "empty": sum(not mb for rank in plan for mb in rank), "mbs": len(flat)}


def timed(function, collect=True):
    if collect:
        gc.collect()
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


class Row:
    def __init__(self, framework, function, cell):
        self.framework, self.function = framework, function
        self.input, self.n, self.ranks = cell["input"], cell["n"], cell["ranks"]
        self.fw_times, self.rl_times, self.fw, self.rl = [], [], [], []
        self.note = ""
        self.fallbacks = 0  # AReaL's kk_allocate falling back to FFD

    def add(self, fw_time, fw_score, rl_time, rl_score):
        if fw_score is not None:
            self.fw_times.append(fw_time)
            self.fw.append(fw_score)
        self.rl_times.append(rl_time)
        self.rl.append(rl_score)

    @property
    def has_fw(self):
        return bool(self.fw)

    def speed(self):
        return statistics.median(self.fw_times) / statistics.median(self.rl_times)

    def holds(self):
        """Drop-in's step time <= the framework's on every seed and no micro-batch of
        the drop-in over the cap."""
        return (all(r["step"] <= f["step"] for f, r in zip(self.fw, self.rl))
                and not sum(r["over"] for r in self.rl))


def pair(fw, rl, seed, collect=True):
    """Times `fw` (None: not available) and `rl`, alternating which goes first."""
    if fw is None:
        rl_time, rl_result = timed(rl, collect)
        return None, None, rl_time, rl_result
    if seed % 2 == 0:
        fw_time, fw_result = timed(fw, collect)
        rl_time, rl_result = timed(rl, collect)
    else:
        rl_time, rl_result = timed(rl, collect)
        fw_time, fw_result = timed(fw, collect)
    return fw_time, fw_result, rl_time, rl_result


def per_rank(split, fw, rl, seed):
    """Per-rank calls on the same `split`: (fw time / ranks, fw plan, rl time / ranks,
    rl plan), the plans in global indices. `fw` / `rl` map a rank's global indices to
    local micro-batches."""
    fw_total = rl_total = 0.0
    fw_plan, rl_plan = [], []
    gc.collect()  # once for the step's calls (per call it would dominate at 256 ranks)
    for members in split:
        ft, fp, rt, rp = pair(None if fw is None else (lambda: fw(members)),
                              lambda: rl(members), seed, collect=False)
        rl_total += rt
        rl_plan.append([[members[i] for i in mb] for mb in rp])
        if fw is not None:
            fw_total += ft
            fw_plan.append([[members[i] for i in mb] for mb in fp])
    ranks = len(split)
    return (fw_total / ranks if fw is not None else None, fw_plan if fw is not None else None,
            rl_total / ranks, rl_plan)


def deal(bins, ranks):
    return [bins[s::ranks] for s in range(ranks)]


# ----------------------------------------------------------------------------------
# The frameworks


class LengthBatch:
    """What verl's rearrange_micro_batches and the drop-in read of a padded batch:
    `input_ids` (not nested), `attention_mask`'s width and row sums; selecting rows
    of it is free."""

    class _Mask:
        def __init__(self, lengths):
            self.lengths = lengths
            self.shape = (len(lengths), int(lengths.max()))

        def sum(self, dim):
            assert dim == 1
            return self.lengths

    def __init__(self, lengths):
        import torch
        self._fields = {"input_ids": SimpleNamespace(is_nested=False),
                        "attention_mask": self._Mask(torch.tensor(lengths, dtype=torch.int64))}

    def __getitem__(self, key):
        return self._fields[key] if isinstance(key, str) else None


def run_verl(ups, cell, seed, rows):
    from rlsched.integrations import verl as dropin
    import torch
    lengths, cap, ranks, overhead = cell["lengths"], cell["cap"], cell["ranks"], cell["overhead"]
    micro, split = rows
    if ups is not None:
        workloads = ups.calculate_workload(torch.tensor(lengths, dtype=torch.int64)).tolist()
        fw_split_call = lambda: ups.get_seqlen_balanced_partitions(workloads, ranks, True)
        rl_split_call = lambda: dropin.get_seqlen_balanced_partitions(workloads, ranks, True)
    else:
        fw_split_call = None
        rl_split_call = lambda: dropin.get_seqlen_balanced_partitions(lengths, ranks, True)
    fw_split_time, fw_split, rl_split_time, rl_split = pair(fw_split_call, rl_split_call, seed)

    def fw_micro(members):
        return ups.rearrange_micro_batches(LengthBatch([lengths[i] for i in members]), cap)[1]

    def rl_micro(members):
        return dropin.rearrange_micro_batches(LengthBatch([lengths[i] for i in members]), cap)[1]

    same = fw_split if ups is not None else rl_split
    ft, fp, rt, rp = per_rank(same, fw_micro if ups is not None else None, rl_micro, seed)
    micro.add(ft, fp and evaluate(fp, lengths, cap, overhead, "verl micro"),
              rt, evaluate(rp, lengths, cap, overhead, "drop-in micro"))
    # the split row's step: each side's split, then its own micro-batching
    rl_pipeline = [[[members[i] for i in mb] for mb in rl_micro(members)] for members in rl_split]
    split.add(fw_split_time, fp and evaluate(fp, lengths, cap, overhead, "verl pipeline"),
              rl_split_time, evaluate(rl_pipeline, lengths, cap, overhead, "drop-in pipeline"))


SLIME_MODES = {"first-fit": (False, False), "balance_data": (True, False), "flops": (True, True)}


def run_slime(schedule, cell, seed, rows, run_all):
    from rlsched.integrations import slime as dropin
    lengths, cap, ranks, overhead = cell["lengths"], cell["cap"], cell["ranks"], cell["overhead"]
    n = len(lengths)
    config = {"dp_size": ranks, "cp_size": 1, "vpp_size": 1,
              "microbatch_group_size_per_vp_stage": 1}
    ids = [i // GROUP for i in range(n)]
    for (mode, (balance_data, by_flops)), row in zip(SLIME_MODES.items(), rows):
        args = SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=cap,
                               micro_batch_size=1, balance_data=balance_data,
                               balance_by_flops=by_flops, **MODEL)
        if (balance_data or by_flops) and schedule is None:  # the drop-in's cost is FLOPs
            row.note = "skipped: the drop-in reads slime's FLOPs function (no checkout)"
            continue
        fw = None
        if schedule is not None:
            sets = n * -(-sum(lengths) // cap)
            if by_flops and sets > FLOPS_KK_SET_LIMIT and not run_all:
                row.note = f"slime not run: n·K = {sets / 1e6:.1f}M KK sets"
            else:
                fw = lambda: schedule.build_dp_schedule(args, config, lengths,
                                                        global_batch_size=n // GROUP,
                                                        rollout_indices=ids)
        rl = lambda: dropin.build_dp_schedule(args, config, lengths,
                                              global_batch_size=n // GROUP, rollout_indices=ids)
        ft, fr, rt, rr = pair(fw, rl, seed)

        def plan(result):
            partitions, micro_batch_indices, _, _ = result
            return [[[partitions[r][j] for j in mb] for mb in micro_batch_indices[r]]
                    for r in range(ranks)]

        row.add(ft, fr and evaluate(plan(fr), lengths, cap, overhead, f"slime {mode}"),
                rt, evaluate(plan(rr), lengths, cap, overhead, f"drop-in {mode}"))


def run_nemo_rl(algorithms, cell, seed, rows):
    from rlsched.integrations import nemo_rl as dropin
    lengths, cap, ranks, overhead = cell["lengths"], cell["cap"], cell["ranks"], cell["overhead"]
    fw = None if algorithms is None else (lambda: algorithms.get_packer(
        "modified_first_fit_decreasing", cap, min_bin_count=ranks,
        bin_count_multiple=ranks).pack(lengths))
    ft, fr, rt, rr = pair(fw, lambda: dropin.pack(lengths, cap, ranks, ranks), seed)
    rows[0].add(ft, fr and evaluate(deal(fr, ranks), lengths, cap, overhead, "NeMo-RL"),
                rt, evaluate(deal(rr, ranks), lengths, cap, overhead, "drop-in"))


def run_areal(seqpack, cell, seed, rows):
    import numpy as np
    from rlsched.integrations import areal as dropin
    lengths, cap, ranks, overhead = cell["lengths"], cell["cap"], cell["ranks"], cell["overhead"]
    redistribute, kk_row, ffd_row = rows
    groups = len(lengths) // GROUP
    totals = [sum(lengths[g * GROUP:(g + 1) * GROUP]) for g in range(groups)]

    def members(allocation):  # rank r takes allocation[r]: its trajectories' sequences
        return [[i for g in part for i in range(g * GROUP, (g + 1) * GROUP)]
                for part in allocation]

    fw = None if seqpack is None else (
        lambda: seqpack.kk_allocate(totals, capacity=int(1e12), min_groups=ranks))
    ft, fr, rt, rr = pair(fw, lambda: dropin.kk_allocate(totals, capacity=int(1e12),
                                                         min_groups=ranks), seed)
    fw_split, rl_split = (members(fr) if fr else None), members(rr)

    def lens(ms):
        return np.array([lengths[i] for i in ms], dtype=np.int64)

    def rl_mbs(ms):
        return dropin.kk_allocate(lens(ms), cap, min_groups=1, n_groups_divisor=1)

    same = fw_split if fw_split is not None else rl_split
    kk = None if seqpack is None else (
        lambda ms: seqpack.kk_allocate(lens(ms), cap, min_groups=1, n_groups_divisor=1))
    ffd = None if seqpack is None else (
        lambda ms: seqpack.ffd_allocate(lens(ms), cap, min_groups=1, n_groups_divisor=1))
    before = AREAL_FALLBACKS.count
    kt, kp, krt, krp = per_rank(same, kk, rl_mbs, seed)
    kk_row.fallbacks += AREAL_FALLBACKS.count - before
    kk_row.add(kt, kp and evaluate(kp, lengths, cap, overhead, "AReaL kk"),
               krt, evaluate(krp, lengths, cap, overhead, "drop-in"))
    dt, dp, drt, drp = per_rank(same, ffd, rl_mbs, seed)
    ffd_row.add(dt, dp and evaluate(dp, lengths, cap, overhead, "AReaL ffd"),
                drt, evaluate(drp, lengths, cap, overhead, "drop-in"))
    rl_pipeline = [[[ms[i] for i in mb] for mb in rl_mbs(ms)] for ms in rl_split]
    redistribute.add(ft, kp and evaluate(kp, lengths, cap, overhead, "AReaL pipeline"),
                     rt, evaluate(rl_pipeline, lengths, cap, overhead, "drop-in pipeline"))


# ----------------------------------------------------------------------------------
# Report


def _ms(seconds):
    return f"{seconds * 1e3:,.2f}" if seconds < 10 else f"{seconds * 1e3:,.0f}"


def _pair(fw, rl):
    return f"{fw} / {rl}"


def print_table(rows, seeds_of):
    print("| framework | decision | input | n | ranks | seeds | framework ms | drop-in ms | "
          "speed | framework step | drop-in/framework step (worst) | drop-in <= | "
          "largest mb (fw / rl) | over cap (fw / rl) | empty (fw / rl) | mbs (fw / rl) |")
    print("|" + "---|" * 3 + "---:|" * 13)
    for row in rows:
        seeds = len(row.rl)
        if not seeds:
            print(f"| {row.framework} | {row.function} | {row.input} | {row.n:,} | "
                  f"{row.ranks} | 0 | {row.note} |" + " |" * 9)
            continue
        rl_ms = _ms(statistics.median(row.rl_times))
        largest_rl = max(s["largest"] for s in row.rl)
        over_rl = sum(s["over"] for s in row.rl)
        empty_rl = sum(s["empty"] for s in row.rl)
        mbs_rl = statistics.median(s["mbs"] for s in row.rl)
        if row.has_fw:
            fw_ms = _ms(statistics.median(row.fw_times))
            speed = f"{row.speed():,.1f}x"
            fw_step = f"{statistics.median(s['step'] for s in row.fw):,.0f}"
            worst = f"{max(r['step'] / f['step'] for f, r in zip(row.fw, row.rl)):.4f}"
            wins = f"{sum(r['step'] <= f['step'] for f, r in zip(row.fw, row.rl))}/{seeds}"
            largest = _pair(f"{max(s['largest'] for s in row.fw):,}", f"{largest_rl:,}")
            over = _pair(sum(s["over"] for s in row.fw), over_rl)
            empty = _pair(sum(s["empty"] for s in row.fw), empty_rl)
            mbs = _pair(f"{statistics.median(s['mbs'] for s in row.fw):g}", f"{mbs_rl:g}")
        else:
            fw_ms = speed = fw_step = worst = wins = "—"
            largest = _pair("—", f"{largest_rl:,}")
            over, empty = _pair("—", over_rl), _pair("—", empty_rl)
            mbs = _pair("—", f"{mbs_rl:g}")
        rl_step = statistics.median(s["step"] for s in row.rl)
        if not row.has_fw:
            fw_step = f"— (drop-in {rl_step:,.0f})"
        name = row.function + (f" ({row.note})" if row.note else "")
        print(f"| {row.framework} | {name} | {row.input} | {row.n:,} | {row.ranks} | {seeds} | "
              f"{fw_ms} | {rl_ms} | {speed} | {fw_step} | {worst} | {wins} | {largest} | "
              f"{over} | {empty} | {mbs} |")


def print_verdicts(rows, frameworks, big_n):
    print()
    for framework, available in frameworks.items():
        mine = [r for r in rows if r.framework == framework and r.rl]
        if not available:
            print(f"- {framework}: its function is not available (no checkout given); the "
                  f"drop-in ran alone ({sum(len(r.rl) for r in mine)} plans, "
                  f"{sum(s['over'] for r in mine for s in r.rl)} micro-batches over the cap)")
            continue
        compared = [r for r in mine if r.has_fw]
        failing = [r for r in compared if not r.holds()]
        seeds = sum(len(r.fw) for r in compared)
        over = sum(s["over"] for r in mine for s in r.rl)
        big = [r for r in compared if r.n == big_n]
        if big:
            speeds = sorted(r.speed() for r in big)
            slow = [r for r in big if r.speed() < 10]
            speed = (f"speed at {big_n:,} sequences: min {speeds[0]:,.1f}x, median "
                     f"{statistics.median(speeds):,.1f}x, max {speeds[-1]:,.1f}x over "
                     f"{len(big)} rows; target >= 10x "
                     + ("met in every row" if not slow else
                        f"NOT met in {len(slow)} rows: " + ", ".join(
                            f"{r.function} {r.input} {r.ranks} ranks ({r.speed():.1f}x)"
                            for r in slow)))
        else:
            speed = f"no row at {big_n:,} sequences"
        holds = ("yes" if not failing else
                 f"NO in {len(failing)} of {len(compared)} rows: " + ", ".join(
                     f"{r.function} {r.input} n={r.n:,} {r.ranks} ranks "
                     f"(worst {max(x['step'] / f['step'] for f, x in zip(r.fw, r.rl)):.6f}, "
                     f"{sum(x['step'] <= f['step'] for f, x in zip(r.fw, r.rl))}/{len(r.rl)} "
                     f"seeds, "
                     f"{framework}'s micro-batches over the cap: {sum(f['over'] for f in r.fw)})"
                     for r in failing))
        print(f"- {framework}: drop-in step time <= {framework}'s on every seed and no drop-in "
              f"micro-batch over the cap ({len(compared)} rows, {seeds} seeds; drop-in "
              f"micro-batches over the cap: {over}): {holds}. {speed}.")


def tensor_split_note(ups):
    """verl's driver passes calculate_workload's int64 tensor; its function on the
    tensor against the list, once."""
    import torch
    from rlsched.integrations import verl as dropin
    lengths = Inputs().lengths("synthetic", 4096, 0)
    tensor = ups.calculate_workload(torch.tensor(lengths, dtype=torch.int64))
    listed = tensor.tolist()
    t_list, _ = timed(lambda: ups.get_seqlen_balanced_partitions(listed, 64, True))
    t_tensor, _ = timed(lambda: ups.get_seqlen_balanced_partitions(tensor, 64, True))
    t_rl, _ = timed(lambda: dropin.get_seqlen_balanced_partitions(tensor, 64, True))
    print(f"\nverl split on the int64 tensor the driver passes (synthetic, n=4,096, 64 ranks, "
          f"one call): verl {_ms(t_tensor)} ms (on a list: {_ms(t_list)} ms), drop-in "
          f"{_ms(t_rl)} ms ({t_tensor / t_rl:,.0f}x)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl", help="root of a verl checkout (1dda039b9)")
    parser.add_argument("--slime", help="root of a slime checkout (624b824a8)")
    parser.add_argument("--nemo-rl", help="root of a NeMo-RL checkout (7ea279abf)")
    parser.add_argument("--areal", help="root of an AReaL checkout (cbff54d64)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds up to 4,096 sequences")
    parser.add_argument("--big-seeds", type=int, default=3, help="seeds at 16,384 sequences")
    parser.add_argument("--quick", action="store_true",
                        help="1,024 sequences, 8 and 64 ranks, 2 seeds")
    parser.add_argument("--all", action="store_true",
                        help="run slime's balance_by_flops whatever its size")
    args = parser.parse_args()

    import rlsched
    if not rlsched.native_available():
        sys.exit("rlsched's native module is not importable (PYTHONPATH=python:build/python)")
    ups = {
        "verl": args.verl and load_verl(args.verl),
        "slime": args.slime and load_slime(args.slime),
        "NeMo-RL": args.nemo_rl and load_nemo_rl(args.nemo_rl),
        "AReaL": args.areal and load_areal(args.areal),
    }
    for name, loaded in ups.items():
        if not loaded:
            print(f"{name}: its function is not available (no checkout given): the drop-in "
                  "runs alone")

    if args.quick:
        sizes, rank_counts, seeds_of = [1024], [8, 64], {1024: 2}
    else:
        sizes, rank_counts = [4096, 16384], [8, 64, 256]
        seeds_of = {4096: args.seeds, 16384: min(args.seeds, args.big_seeds)}
    inputs = Inputs()
    names = ["amc23", "intellect3", "synthetic"]
    print("caps: " + ", ".join(f"{name} {inputs.cap[name]:,}" for name in names)
          + f"; groups of {GROUP}; seeds: " + ", ".join(
              f"{seeds_of[n]} at n={n:,}" for n in sizes))

    def run_cell(cell, seeds, offset=0):
        verl_rows = [Row("verl", "micro", cell), Row("verl", "split", cell)]
        slime_rows = [Row("slime", mode, cell) for mode in SLIME_MODES]
        nemo_rows = [Row("NeMo-RL", "mffd", cell)]
        areal_rows = [Row("AReaL", f, cell) for f in ("redistribute", "kk mbs", "ffd mbs")]
        for seed in range(offset, offset + seeds):
            lengths = inputs.lengths(cell["input"], cell["n"], seed)
            cell["lengths"] = lengths
            cell["overhead"] = rlsched.plan_step(lengths, num_ranks=cell["ranks"],
                                                 max_token_len=cell["cap"]).overhead
            overheads.add(cell["overhead"])
            run_verl(ups["verl"], cell, seed, verl_rows)
            run_slime(ups["slime"], cell, seed, slime_rows, args.all)
            run_nemo_rl(ups["NeMo-RL"], cell, seed, nemo_rows)
            run_areal(ups["AReaL"], cell, seed, areal_rows)
        return verl_rows + slime_rows + nemo_rows + areal_rows

    rows, overheads = [], set()
    # warm-up, not reported: every pair once on a small batch (the drop-ins' first
    # calls load the native module's solvers and the in-process client)
    for name in names:
        run_cell({"input": name, "n": 512, "ranks": 8, "cap": inputs.cap[name]}, 1, 10**6)
    overheads.clear()
    start = time.perf_counter()
    for n in sizes:
        for name in names:
            for ranks in rank_counts:
                cell = {"input": name, "n": n, "ranks": ranks, "cap": inputs.cap[name]}
                rows += run_cell(cell, seeds_of[n])
                print(f"  {name} n={n:,} ranks={ranks}: done at "
                      f"{time.perf_counter() - start:,.0f} s", file=sys.stderr, flush=True)

    order = {"verl": 0, "slime": 1, "NeMo-RL": 2, "AReaL": 3}
    rows.sort(key=lambda r: order[r.framework])  # stable: cells in run order within one
    print("overhead per micro-batch (rlsched.plan_step's `overhead` on each batch): "
          + ", ".join(f"{o:,}" for o in sorted(overheads)) + " tokens")
    print()
    print_table(rows, seeds_of)
    fallbacks = [r for r in rows if r.fallbacks]
    if ups["AReaL"]:
        calls = sum(len(r.fw) * r.ranks for r in rows if r.framework == "AReaL"
                    and r.function == "kk mbs")
        print(f"\nAReaL's kk_allocate fell back to its FFD (a Karmarkar-Karp group over the "
              f"cap) in {sum(r.fallbacks for r in fallbacks)} of its {calls} per-rank calls"
              + ("" if not fallbacks else " (" + ", ".join(
                  f"{r.input} n={r.n:,} {r.ranks} ranks: {r.fallbacks}" for r in fallbacks) + ")"))
    if ups["verl"]:
        tensor_split_note(ups["verl"])
    print_verdicts(rows, {k: bool(v) for k, v in ups.items()}, max(sizes))
    print(f"\ntotal {time.perf_counter() - start:,.0f} s")


if __name__ == "__main__":
    main()
