"""The weight-sync executor (rlsched.weight_sync.executor) on real torch.distributed worlds: gloo on
loopback, one forked process per rank (rlsched.weight_sync.launcher), tiny models of every
family (tests/data/configs/tiny-*.json). Every engine tensor is compared bit for bit
with the vLLM layout built independently from the full tensors. Skipped, with a
message, where the interpreter has no torch (Debian: python3-torch).
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip(
    "torch", reason="the executor's tests need torch (Debian: apt-get install python3-torch)")

# Imported after the importorskip above (noqa: E402).
from rlsched.weight_sync import executor, launcher  # noqa: E402
from rlsched.weight_sync import layouts as lay  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CONFIGS = os.path.join(_REPO, "tests", "data", "configs")


def config(family):
    return os.path.join(_CONFIGS, f"tiny-{family}.json")


def run_checked(family, train, infer, colocated=False, **kw):
    s = launcher.run(config(family), train, infer, colocated=colocated, check=True,
                     bucket_mib=kw.pop("bucket_mib", 1), timeout=60, **kw)
    assert "refused" not in s and "error" not in s, s.get("refused") or s.get("error")
    return s


def assert_exact(s):
    c = s["check"]
    assert c["ok"], c["problems"]
    assert c["mismatched_elements"] == 0 and c["engine_ranks"] == s["engine_ranks"]
    # The executor moved what the plan says, once per collective.
    assert s["bytes_moved"] == s["plan"]["bytes_moved"]
    assert s["bytes_local"] == s["plan"]["bytes_local"]
    assert s["bytes_received"] + s["bytes_local"] == s["plan"]["bytes_received"]
    assert s["buckets"] == s["plan"]["num_buckets"]


# (family, train, infer, colocated): TP 2->1, 1->2, PP 2->1, DP/CP replicas as senders,
# EP 2 -> TP 2 (with and without engine expert parallelism), colocated and separate.
WORLDS = [
    ("llama", {"tp": 2}, {"tp": 1}, False),
    ("llama", {"tp": 1}, {"tp": 2}, False),
    ("llama", {"pp": 2}, {"tp": 1, "replicas": 2}, True),
    ("llama", {"tp": 2, "cp": 2}, {"tp": 2, "replicas": 2}, True),
    ("qwen2", {"tp": 2}, {"tp": 1}, True),
    ("qwen2", {"tp": 1}, {"tp": 2}, False),
    ("qwen2", {"pp": 2}, {"tp": 1}, False),
    ("qwen2", {"tp": 2, "dp": 2}, {"tp": 2, "replicas": 2}, False),
    ("qwen3", {"tp": 2}, {"tp": 1}, False),
    ("qwen3", {"tp": 1}, {"tp": 2}, False),
    ("qwen3", {"pp": 2, "dp": 2}, {"tp": 2, "replicas": 2}, True),
    ("qwen3-moe", {"tp": 2}, {"tp": 1}, False),
    ("qwen3-moe", {"tp": 1}, {"tp": 2}, False),
    ("qwen3-moe", {"pp": 2}, {"tp": 1}, True),
    ("qwen3-moe", {"tp": 2, "ep": 2}, {"tp": 2}, False),
    ("qwen3-moe", {"dp": 2, "ep": 2}, {"tp": 2, "ep": True}, True),
    ("qwen3-moe", {"tp": 2, "ep": 2, "etp": 2, "dp": 2}, {"tp": 2, "replicas": 2}, False),
    ("deepseek-v3", {"tp": 2}, {"tp": 1}, False),
    ("deepseek-v3", {"tp": 1}, {"tp": 2}, False),
    ("deepseek-v3", {"pp": 2}, {"tp": 1}, True),
    ("deepseek-v3", {"tp": 2, "ep": 2}, {"tp": 2}, True),
    ("deepseek-v3", {"dp": 2, "ep": 2}, {"tp": 2, "ep": True, "replicas": 2}, False),
]


# Every other world moves each transfer alone (straight from and into the tensors where
# a slice is contiguous, through a staging buffer where not); the others pack them per
# (source, destination set), as transfers below the 1 MiB default threshold are.
@pytest.mark.parametrize("family,train,infer,colocated,direct",
                         [w + (k % 2 == 1,) for k, w in enumerate(WORLDS)],
                         ids=[f"{f}-{t}-{i}-{'coloc' if c else 'sep'}-"
                              f"{'direct' if k % 2 else 'packed'}".replace(" ", "")
                              for k, (f, t, i, c) in enumerate(WORLDS)])
def test_byte_exact(family, train, infer, colocated, direct):
    s = run_checked(family, train, infer, colocated, direct_min_bytes=1 if direct else 0)
    assert_exact(s)
    assert (s["direct_collectives"] == s["collectives"]) if direct else s["direct_collectives"] == 0


def test_round_robin_experts_binary_plan_and_callback():
    # Engine EP with round-robin experts, each rank reading only its part of the binary
    # plan, engines receiving through the callback instead of preallocated tensors.
    s = run_checked("qwen3-moe", {"tp": 2, "ep": 2}, {"tp": 2, "ep": True, "replicas": 2,
                                                      "round_robin_experts": True},
                    plan_format="binpb", deliver="callback")
    assert_exact(s)


def test_repeated_syncs_read_the_sources_each_time():
    # One Executor per rank runs three syncs; the trainer's tensors change in place
    # between them; the engines end with the last sync's bytes exactly.
    for direct in (0, 1):
        s = run_checked("qwen3", {"tp": 2, "dp": 2}, {"tp": 1, "replicas": 2}, True,
                        direct_min_bytes=direct, syncs=3)
        assert_exact(s)


def test_a_kept_staging_buffer_is_reused_and_the_bytes_stay_exact():
    # keep_staging: one staging buffer per rank for all the syncs (the later ones
    # allocate none), and every transfer packed through it: the last sync's bytes exact.
    s = run_checked("qwen3", {"tp": 2, "dp": 2}, {"tp": 1, "replicas": 2}, True,
                    direct_min_bytes=0, syncs=3, keep_staging=True)
    assert_exact(s)
    assert s["peak_staging_bytes"] > 0 and s["staging_allocated_bytes"] == 0
    # Without it, each sync allocates its own.
    s = run_checked("qwen3", {"tp": 2, "dp": 2}, {"tp": 1, "replicas": 2}, True,
                    direct_min_bytes=0, syncs=2)
    assert s["staging_allocated_bytes"] >= s["peak_staging_bytes"] > 0


def test_virtual_and_uneven_pipeline(tmp_path):
    # Six layers over PP 2 x VPP 3 chunks, and PP 3 with a two-layer first stage.
    cfg = json.load(open(config("llama")))
    cfg.update(num_hidden_layers=6, tie_word_embeddings=True)
    path = tmp_path / "six-layers.json"
    path.write_text(json.dumps(cfg))
    for train in ({"pp": 2, "vpp": 3}, {"pp": 3, "first_stage_layers": 2}):
        s = launcher.run(str(path), train, {"tp": 2}, check=True, bucket_mib=1, timeout=60)
        assert_exact(s)


def test_buckets_bound_staging_memory(tmp_path):
    # A 4 MB model in 1 MiB buckets, every transfer packed: several buckets, and no rank
    # stages more than its budget each way (a separate rank only sends or only receives;
    # a colocated one may do both) plus the alignment of the packed slices.
    cfg = json.load(open(config("llama")))
    cfg.update(hidden_size=256, intermediate_size=1024, vocab_size=1000)
    path = tmp_path / "four-mb.json"
    path.write_text(json.dumps(cfg))
    budget = 1 << 20
    for colocated, ways in ((False, 1), (True, 2)):
        s = launcher.run(str(path), {"tp": 2}, {"tp": 1, "replicas": 2}, colocated=colocated,
                         check=True, bucket_mib=1, timeout=60, direct_min_bytes=0)
        assert_exact(s)
        assert s["buckets"] >= 3
        assert 0 < s["peak_staging_bytes"] <= ways * budget + 8 * s["plan"]["num_transfers"]
    # fp8, the senders' codes packed or alone (then their scales packed apart: two
    # aligned parts): the staging holds the bucket's fp8 bytes.
    for direct in (0, 1):
        s = launcher.run(str(path), {"tp": 2}, {"tp": 1, "replicas": 2}, check=True,
                         bucket_mib=1, timeout=60, direct_min_bytes=direct,
                         target_dtype="fp8")
        assert s["check"]["ok"], s["check"]["problems"]
        assert s["buckets"] >= 2 and s["quantized_at_sender"] > 0
        assert 0 < s["peak_staging_bytes"] <= budget + 16 * s["plan"]["num_transfers"]


# ---------------------------------------------------------------------------------
# Wrong plans.

def write_plan(tmp_path, family, train, infer, colocated=False, name="plan.json"):
    path = str(tmp_path / name)
    launcher.plan_with_rlsched(os.environ["RLSCHED_BIN"], config(family), train,
                               infer, colocated, 1, path)
    with open(path) as f:
        return path, json.load(f)


def run_plan(family, train, infer, plan_path, colocated=False):
    return launcher.run(config(family), train, infer, colocated=colocated, check=True,
                        plan_path=plan_path, timeout=60)


def test_shifted_slice_is_caught_by_the_check(tmp_path):
    train, infer = {"tp": 2}, {"tp": 1, "replicas": 2}
    path, plan = write_plan(tmp_path, "qwen3", train, infer)
    model = lay.parse_config(open(config("qwen3")).read())
    full = lay.full_tensors(model)
    shards = {r: lay.megatron_shards(model, lay.Train(**train), r, full) for r in range(2)}
    # The first matrix slice that can move down one row and stay inside its tensor.
    for t in plan["transfers"]:
        rows = shards[int(t["src_rank"])][t["src_param"]].shape[0]
        if len(t["src_slice"]) == 2 and int(t["src_slice"][0]["end"]) < rows:
            for key in ("begin", "end"):
                t["src_slice"][0][key] = str(int(t["src_slice"][0][key]) + 1)
            break
    else:
        pytest.fail("no slice to shift")
    with open(path, "w") as f:
        json.dump(plan, f)
    s = run_plan("qwen3", train, infer, path)
    assert "refused" not in s and not s["check"]["ok"]
    assert s["check"]["mismatched_elements"] > 0
    assert any(t["dst_param"] in p for p in s["check"]["problems"])


def test_wrong_source_rank_is_caught_by_the_check(tmp_path):
    train, infer = {"tp": 2}, {"tp": 2}
    path, plan = write_plan(tmp_path, "llama", train, infer)
    # TP rank 1 holds the same tensor names and shapes as TP rank 0, other contents.
    t = next(t for t in plan["transfers"] if t["src_param"].endswith("linear_qkv.weight"))
    t["src_rank"] = str(1 - int(t["src_rank"]))
    with open(path, "w") as f:
        json.dump(plan, f)
    s = run_plan("llama", train, infer, path)
    assert "refused" not in s and not s["check"]["ok"]
    assert any("qkv_proj.weight" in p for p in s["check"]["problems"])


@pytest.mark.parametrize("plan_layout,run_layout,field", [
    # A plan for 3 ranks (TP 2 trainer) run by a 2-rank world.
    (({"tp": 2}, {"tp": 1}), ({"tp": 1}, {"tp": 1}), "world_size"),
    # Engine TP 1 (whole tensors) into engine TP 2 shards (the slices would not fit).
    (({"tp": 1}, {"tp": 1, "replicas": 2}), ({"tp": 1}, {"tp": 2}), "infer.tp"),
    # Trainer TP 2 into a PP 2 trainer (rank 0 would lack the last layer).
    (({"tp": 2}, {"tp": 1}), ({"pp": 2}, {"tp": 1}), "train.pp"),
    # Trainer TP 2 into DP 2 ranks: every slice fits the DP ranks' whole tensors, so
    # only the layouts the plan records tell them apart.
    (({"tp": 2}, {"tp": 1}), ({"dp": 2}, {"tp": 1}), "train.tp"),
])
def test_mismatched_plan_is_refused_before_any_transfer(tmp_path, plan_layout, run_layout, field):
    path, _ = write_plan(tmp_path, "llama", *plan_layout)
    s = run_plan("llama", *run_layout, path)
    assert not s["ok"] and "refused" in s, s
    assert f": {field}" in s["refused"]
    assert "buckets" not in s  # no rank started the transfers


def test_plans_record_the_layouts_they_were_made_for(tmp_path):
    # JSON and binary plans carry the request's layouts, sizes filled in.
    train, infer = {"tp": 2, "first_stage_layers": 1, "pp": 2}, {"tp": 1, "replicas": 2}
    path, plan = write_plan(tmp_path, "llama", train, infer)
    want = executor.world_layout(train, infer)
    assert want["train"] == {"tp": 2, "pp": 2, "vpp": 1, "ep": 1, "etp": 1, "cp": 1, "dp": 1,
                             "first_stage_layers": 1}
    assert executor.plan_from_json(plan, 0).made_for == want
    binary = str(tmp_path / "plan.binpb")
    launcher.plan_with_rlsched(os.environ["RLSCHED_BIN"], config("llama"), train, infer,
                               False, 1, binary)
    assert executor.load_plan(binary, 4).made_for == want
    colocated, _ = write_plan(tmp_path, "llama", {"tp": 2}, {"tp": 1}, colocated=True,
                              name="colocated.json")
    assert executor.load_plan(colocated, 0).made_for == executor.world_layout(
        {"tp": 2}, {"tp": 1}, colocated=True)


def test_a_run_part_decodes_as_the_binary_plan_file_does(tmp_path):
    """A run's WeightSyncPlan (rlsched.worker.weights.WeightUpdate) and a binary plan file
    carry the same ReshardRankPart and summary: both decode through
    executor.part_transfers / summary_rank_plan to the same RankPlan, and a part naming
    an entry outside its tables is refused naming where it came from."""
    from rlsched.v1 import reshard_pb2, runtime_pb2
    from rlsched.worker import WeightUpdate
    train, infer = {"tp": 2, "pp": 2}, {"tp": 2, "replicas": 2}
    binary = str(tmp_path / "plan.binpb")
    launcher.plan_with_rlsched(os.environ["RLSCHED_BIN"], config("qwen3"), train, infer,
                               False, 1, binary)
    with open(binary, "rb") as f:
        index = executor._read_delimited(f, reshard_pb2.ReshardPlanIndex)
        parts = {}
        for entry in index.parts:
            f.seek(entry.offset)
            parts[entry.rank] = executor._read_delimited(
                f, reshard_pb2.ReshardRankPart)
    # Replica 1: GPUs 6, 7 (4 trainer GPUs, then 2 per replica).
    message = runtime_pb2.WeightSyncPlan(
        plan_id="0-0001", epoch=0,
        group=runtime_pb2.TransferGroup(name="g", backend="gloo", world_size=8),
        members=[3, 5], replica=1, rank_offset=6, ranks=2, summary=index.summary,
        parts=[parts[6], parts[7]])
    update = WeightUpdate(message)
    for rank in (6, 7):
        want = executor.load_plan(binary, rank)
        assert want.transfers, rank
        assert update.rank_plan(rank) == want
    assert update.rank_plan(6).made_for == executor.world_layout(train, infer)
    message.parts[1].transfers[0].dst_group = len(message.parts[1].dst_groups)
    with pytest.raises(ValueError, match="weight_sync_plan 0-0001: transfer .* of rank 7's "
                                         "part names a parameter or receiver set outside"):
        WeightUpdate(message)
    with pytest.raises(ValueError, match="binary plan: transfer .* of rank 7's part"):
        executor.part_transfers(message.parts[1], 7, "binary plan")


def test_layout_check_names_each_field_that_differs(tmp_path):
    path, plan = write_plan(tmp_path, "llama", {"tp": 2}, {"tp": 1})
    part = executor.plan_from_json(plan, 0)
    model = lay.parse_config(open(config("llama")).read())
    full = lay.full_tensors(model)
    # DP 2 ranks hold whole tensors: every TP 2 slice fits, so the slices alone pass.
    dp_sources = lay.megatron_shards(model, lay.Train(dp=2), 0, full)
    assert executor.check_plan(part, 3, dp_sources, None) == []
    problems = executor.check_plan(part, 3, dp_sources, None,
                                   executor.world_layout({"dp": 2}, {"tp": 1}))
    assert sorted(f for _, f, _ in problems) == ["train.dp", "train.tp"], problems
    assert "the plan is for train.tp = 2, this world runs 1" in [t for _, _, t in problems]
    # The same layouts pass; the target dtype and the placement are compared too.
    same = executor.world_layout({"tp": 2}, {"tp": 1})
    assert executor.check_plan(part, 3, lay.megatron_shards(model, lay.Train(tp=2), 0, full),
                               None, same) == []
    other = executor.world_layout({"tp": 2}, {"tp": 1}, colocated=True, target_dtype="fp8")
    assert sorted(f for _, f, _ in executor.check_layout(part, other)) == [
        "target_dtype", "topology.colocated"]
    # A plan without its layouts (an older rlsched) is refused when a layout is given.
    for key in ("train", "infer", "topology", "target_dtype", "bucket_bytes"):
        plan.pop(key, None)
    old = executor.plan_from_json(plan, 0)
    assert old.made_for is None
    assert executor.check_layout(old, same)[0][1] == "train"
    with pytest.raises(ValueError, match="target_dtype"):
        executor.world_layout({}, {}, target_dtype="int4")


def test_shifted_slice_out_of_bounds_is_refused(tmp_path):
    train, infer = {"tp": 2}, {"tp": 1}
    path, plan = write_plan(tmp_path, "llama", train, infer)
    # The last rows of lm_head moved past the 64-padded vocabulary (320 rows).
    t = max((t for t in plan["transfers"] if t["dst_param"] == "lm_head.weight"),
            key=lambda t: int(t["dst_slice"][0]["end"]))
    for key in ("begin", "end"):
        t["dst_slice"][0][key] = str(int(t["dst_slice"][0][key]) + 64)
    with open(path, "w") as f:
        json.dump(plan, f)
    s = run_plan("llama", train, infer, path)
    assert "refused" in s and "dst_slice[0]: [" in s["refused"] and "lm_head.weight" in s["refused"]


def test_unreadable_plans_name_what_is_wrong(tmp_path):
    path, plan = write_plan(tmp_path, "llama", {"tp": 1}, {"tp": 1})
    del plan["transfers"][3]["src_param"]
    with pytest.raises(ValueError, match=r"transfers\[3\]: .*src_param"):
        executor.plan_from_json(plan, 0)
    binary = str(tmp_path / "plan.binpb")
    launcher.plan_with_rlsched(os.environ["RLSCHED_BIN"], config("llama"), {"tp": 1},
                               {"tp": 1}, False, 1, binary)
    assert len(executor.load_plan(binary, 1).transfers) == len(plan["transfers"])
    data = open(binary, "rb").read()
    cut = str(tmp_path / "cut.binpb")
    open(cut, "wb").write(data[:len(data) // 2])
    with pytest.raises(ValueError, match="binary plan"):
        executor.load_plan(cut, 1)


def test_an_incomplete_or_readdressed_plan_is_refused_before_any_byte(tmp_path):
    # A transfer removed from a JSON plan left elements of the engines' tensors with the
    # previous version's values; a receiver changed to a trainer rank, likewise.
    path, plan = write_plan(tmp_path, "llama", {"tp": 2}, {"tp": 1, "replicas": 2})
    removed = dict(plan, transfers=plan["transfers"][1:])
    with pytest.raises(ValueError, match="transfers: .* num_transfers"):
        executor.plan_from_json(removed, 0)
    unrecorded = {k: v for k, v in removed.items() if k != "num_transfers"}
    with pytest.raises(ValueError, match="bytes_received"):
        executor.plan_from_json(unrecorded, 0)
    moved = json.loads(json.dumps(plan))
    # A receiver changed to trainer rank 1 (separate GPUs: the engines are 2 and 3).
    moved["transfers"][0]["dst_ranks"][0] = 1
    part = executor.plan_from_json(moved, 1)
    model = lay.parse_config(open(config("llama")).read())
    sources = lay.megatron_shards(model, lay.Train(tp=2), 1, lay.full_tensors(model))
    problems = executor.check_plan(part, 4, sources, None)
    assert [field for _, field, _ in problems] == ["dst_ranks"], problems
    bad = tmp_path / "moved.json"
    bad.write_text(json.dumps(moved))
    s = run_plan("llama", {"tp": 2}, {"tp": 1, "replicas": 2}, str(bad))
    assert not s["ok"] and "not engine ranks" in s["refused"], s
    assert "buckets" not in s  # no rank started the transfers


def qkv_transfers(plan, rank=None):
    """The indices of a JSON plan's transfers into layer 0's qkv_proj (of `rank`)."""
    return [i for i, t in enumerate(plan["transfers"])
            if t["dst_param"] == "model.layers.0.self_attn.qkv_proj.weight"
            and (rank is None or str(rank) in t["dst_ranks"])]


def without_transfer(plan, i):
    """`plan` with transfer i removed and its totals adjusted to match: only the
    coverage of the destinations tells."""
    plan = json.loads(json.dumps(plan))
    t = plan["transfers"].pop(i)
    plan["num_transfers"] = str(int(plan["num_transfers"]) - 1)
    plan["bytes_received"] = str(int(plan["bytes_received"])
                                 - int(t["bytes"]) * len(t["dst_ranks"]))
    return plan


def run_refused(tmp_path, plan, train, infer, colocated=False, name="bad.json"):
    """Runs `plan` (no --check); asserts every rank refused it before any byte moved."""
    bad = tmp_path / name
    bad.write_text(json.dumps(plan))
    s = launcher.run(config("llama"), train, infer, colocated=colocated, plan_path=str(bad),
                     timeout=60)
    assert not s["ok"] and "error" not in s and "refused" in s, s.get("error") or s
    assert s["refused_ranks"] == list(range(s["ranks"])), s
    assert "buckets" not in s  # no rank started the transfers
    return s["refused"]


def test_a_plan_missing_a_transfer_is_refused_by_coverage(tmp_path):
    # The totals adjusted with it: a JSON plan that ran (exit 0, qkv_proj elements with
    # the previous version's values) before the coverage check.
    train, infer = {"tp": 2}, {"tp": 1, "replicas": 2}
    _, plan = write_plan(tmp_path, "llama", train, infer)
    i = qkv_transfers(plan)[0]
    refused = run_refused(tmp_path, without_transfer(plan, i), train, infer)
    qkv = "'model.layers.0.self_attn.qkv_proj.weight' (shape [128, 64])"
    first = [int(r["begin"]) for r in plan["transfers"][i]["dst_slice"]]
    for rank in (2, 3):
        assert f"rank {rank}: dst_slice: element {first} of {qkv} is written by no transfer" \
            in refused, refused


def test_overlapping_transfers_are_refused_naming_both(tmp_path):
    train, infer = {"tp": 2}, {"tp": 1, "replicas": 2}
    _, plan = write_plan(tmp_path, "llama", train, infer)
    i, j = qkv_transfers(plan)[:2]
    # j writes i's rows (the same shape: every size and total stays right).
    plan["transfers"][j]["dst_slice"] = plan["transfers"][i]["dst_slice"]
    refused = run_refused(tmp_path, plan, train, infer)
    first = [int(r["begin"]) for r in plan["transfers"][i]["dst_slice"]]
    assert (f"rank 2: dst_slice: element {first} of 'model.layers.0.self_attn.qkv_proj.weight' "
            f"(shape [128, 64]) is written 2 times, by transfers {sorted([i, j])}") in refused


def test_a_bad_plan_seen_by_one_rank_fails_every_rank_with_its_cause(tmp_path):
    # Colocated: the trainer ranks are the engine ranks. One transfer into rank 0's
    # qkv_proj re-addressed to rank 1: rank 0 misses its rows, rank 1 has them twice;
    # then one into rank 1 alone removed (totals adjusted): only rank 1 sees it.
    train, infer = {"tp": 2}, {"tp": 1, "replicas": 2}
    _, plan = write_plan(tmp_path, "llama", train, infer, colocated=True)
    readdressed = json.loads(json.dumps(plan))
    t = readdressed["transfers"][next(i for i in qkv_transfers(plan, 0)
                                      if plan["transfers"][i]["dst_ranks"] == ["0"])]
    t["dst_ranks"] = ["1"]
    refused = run_refused(tmp_path, readdressed, train, infer, colocated=True)
    assert "rank 0: dst_slice: element" in refused and "is written by no transfer" in refused
    assert "rank 1: dst_slice: element" in refused and "is written 2 times" in refused
    i = next(i for i in qkv_transfers(plan, 1) if plan["transfers"][i]["dst_ranks"] == ["1"])
    refused = run_refused(tmp_path, without_transfer(plan, i), train, infer, colocated=True,
                          name="one.json")
    assert "rank 1: dst_slice" in refused and "rank 0:" not in refused, refused


def rewrite_binpb(path, out, edit):
    """Writes binary plan `path` to `out` after `edit(rank, part)` changed its parts (a
    part shared by several ranks is edited once, for the first)."""
    from google.protobuf.internal.encoder import _VarintBytes
    from rlsched.v1 import reshard_pb2
    with open(path, "rb") as f:
        index = executor._read_delimited(f, reshard_pb2.ReshardPlanIndex)
        parts = {}
        for entry in index.parts:
            f.seek(entry.offset)
            parts.setdefault(entry.offset, (entry.rank, executor._read_delimited(
                f, reshard_pb2.ReshardRankPart)))
    blobs = {}
    for offset, (rank, part) in parts.items():
        edit(rank, part)
        data = part.SerializeToString()
        blobs[offset] = _VarintBytes(len(data)) + data
    for entry in index.parts:
        entry.num_transfers = len(parts[entry.offset][1].transfers)
    head = index.SerializeToString()  # offsets are fixed64: the size stays
    at, where = len(_VarintBytes(len(head))) + len(head), {}
    for offset, blob in blobs.items():
        where[offset], at = at, at + len(blob)
    for entry in index.parts:
        entry.offset, entry.size = where[entry.offset], len(blobs[entry.offset])
    head = index.SerializeToString()
    with open(out, "wb") as f:
        f.write(_VarintBytes(len(head)) + head + b"".join(blobs.values()))


def test_a_cut_or_inconsistent_binary_plan_fails_every_rank_with_its_cause(tmp_path):
    train, infer = {"tp": 2}, {"tp": 1, "replicas": 2}
    binary = str(tmp_path / "plan.binpb")
    launcher.plan_with_rlsched(os.environ["RLSCHED_BIN"], config("llama"), train, infer,
                               False, 1, binary)
    data = open(binary, "rb").read()
    cut = tmp_path / "cut.binpb"
    cut.write_bytes(data[:-100])  # the engines' part (read by ranks 2 and 3) cut short
    s = launcher.run(config("llama"), train, infer, plan_path=str(cut), timeout=60)
    # Every rank refused with the cause (before: rank 0's "Connection closed by peer").
    assert "error" not in s and s["refused_ranks"] == [0, 1, 2, 3], s.get("error") or s
    assert "rank 2: plan: cut.binpb: binary plan: a message of" in s["refused"]
    assert "is cut short" in s["refused"] and "rank 0:" not in s["refused"]
    assert s["wall_seconds"] < 30  # no rank waited for the 60 s timeout
    # Trainer rank 0's part without its first transfer, the engines' unchanged: the
    # engines would wait for bytes rank 0 never sends.
    dropped = str(tmp_path / "dropped.binpb")
    rewrite_binpb(binary, dropped, lambda rank, part: rank == 0 and part.transfers.pop(0))
    assert executor.load_plan(binary, 0).transfers[1:] == executor.load_plan(dropped, 0).transfers
    s = launcher.run(config("llama"), train, infer, plan_path=dropped, timeout=60)
    assert "error" not in s and s["refused_ranks"] == [0, 1, 2, 3], s.get("error") or s
    assert "the parts: num_transfers: the ranks' parts send 36 transfers, the plan records 37" \
        in s["refused"], s["refused"]
    assert "the parts: dst_ranks: the senders' parts deliver" in s["refused"]


def test_command_line_refuses_an_incomplete_plan_naming_the_cause(tmp_path):
    train, infer = {"tp": 2}, {"tp": 1, "replicas": 2}
    _, plan = write_plan(tmp_path, "llama", train, infer)
    bad = tmp_path / "removed.json"
    bad.write_text(json.dumps(without_transfer(plan, qkv_transfers(plan)[0])))
    done = subprocess.run(
        [sys.executable, "-m", "rlsched.weight_sync.launcher", "--model", config("llama"),
         "--train", "tp=2", "--infer", "tp=1,replicas=2", "--plan", str(bad), "--timeout", "60"],
        capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "qkv_proj.weight' (shape [128, 64]) is written by no transfer" in done.stderr


def test_check_plan_names_the_field_without_a_world(tmp_path):
    # check_plan() alone: a missing tensor, a wrong dtype (bytes), a slice outside.
    path, plan = write_plan(tmp_path, "llama", {"tp": 1}, {"tp": 1})
    part = executor.plan_from_json(plan, 0)
    model = lay.parse_config(open(config("llama")).read())
    sources = lay.megatron_shards(model, lay.Train(), 0, lay.full_tensors(model))
    assert executor.check_plan(part, 2, sources, None) == []
    broken = dict(sources)
    del broken["decoder.final_layernorm.weight"]
    broken["decoder.layers.0.mlp.linear_fc2.weight"] = torch.zeros(64, 64, dtype=torch.bfloat16)
    broken["decoder.layers.1.mlp.linear_fc2.weight"] = torch.zeros(64, 128, dtype=torch.float32)
    problems = executor.check_plan(part, 2, broken, None)
    fields = sorted(field for _, field, _ in problems)
    assert fields == ["bytes", "src_param", "src_slice[1]"], problems
    assert executor.check_plan(part, 3, sources, None)[0][1] == "world_size"


@pytest.mark.parametrize("fault", ["exit", "stall"])
def test_a_lost_rank_fails_the_others_within_the_timeout(fault):
    # Engine rank 5 exits (its peers see the connection close) or stays silent (they
    # time out): every sender of its data fails, none waits past the 2 s timeout.
    s = launcher.run(config("llama"), {"tp": 2, "pp": 2}, {"tp": 2, "replicas": 2},
                     fault_rank=5, fault=fault, timeout=2)
    assert not s["ok"] and "error" in s
    f = s["fault"]
    assert f["failed_ranks"] and 5 not in f["failed_ranks"]
    # Each failed rank's error, one line each (the first rank's alone may be a peer's).
    assert [e.split(":")[0] for e in s["errors"]] == [f"rank {r}" for r in f["failed_ranks"]]
    assert f["max_seconds_to_error"] < 2 + 1.5
    if fault == "stall":
        assert "Timed out" in s["error"] and f["max_seconds_to_error"] >= 1.9


# ---------------------------------------------------------------------------------
# fp8 targets.

def test_e4m3_rounds_to_nearest_even_and_saturates():
    # Every finite e4m3 value, every midpoint between neighbours (ties), random values
    # over 22 binades, values past 448, both signs: the bits equal the nearest code by
    # brute force (ties to the even code, saturated at 448).
    codes = torch.arange(0, 0x7F)
    e, m = (codes >> 3) & 15, codes & 7
    values = torch.where(e == 0, m.double() * 2.0 ** -9,
                         (1 + m.double() / 8) * torch.pow(2.0, (e - 7).double()))
    g = torch.Generator().manual_seed(7)
    x = torch.cat([values, (values[1:] + values[:-1]) / 2,
                   torch.exp2(torch.rand(5000, generator=g, dtype=torch.float64) * 22 - 13),
                   torch.tensor([448.0, 449.0, 464.0, 1e6])]).float()
    x = torch.cat([x, -x])
    distance = (x.abs().double()[:, None] - values[None, :]).abs()
    nearest = distance == distance.min(1).values[:, None]
    ties = nearest.sum(1) > 1
    want = torch.where(ties, (nearest & (codes[None, :] % 2 == 0)).float().argmax(1),
                       nearest.float().argmax(1)) | (torch.signbit(x).long() << 7)
    assert torch.equal(executor.e4m3_bits(x).long(), want)
    assert executor.e4m3_bits(torch.tensor([1.0, -2.0, 448.0, 2.0 ** -9])).tolist() == [
        0x38, 0xC0, 0x7E, 0x01]


def test_quantize_block128_scales_each_block():
    x = torch.zeros(2, 130, 260, dtype=torch.bfloat16)
    x[1, 129, 259] = -3.0  # the last (partial) block of the second matrix
    x[0, 5, 5] = 896.0
    codes, scales = executor.quantize_block128(x)
    assert codes.shape == x.shape and scales.shape == (2, 2, 3)
    assert scales[1, 1, 2] == torch.tensor(3.0) / 448 and codes[1, 129, 259] == 0xFE  # -448
    assert scales[0, 0, 0] == 2.0 and codes[0, 5, 5] == 0x7E
    assert int((scales == 1).sum()) == 10  # the all-zero blocks
    assert int((codes != 0).sum()) == 2


def reference_quantize_block128(x):
    """The quantiser as first written: 128 rows at a time, the block amax of the float32
    values, x / scale in float32, then the per-element formula (e4m3_bits, checked by
    brute force above). The executor's quantiser must give the same bits."""
    shape = tuple(x.shape)
    rows, cols = shape[-2], shape[-1]
    codes = torch.empty(shape, dtype=torch.uint8)
    scales = torch.empty(executor.scale_shape(shape), dtype=torch.float32)
    bc = -(-cols // 128)
    for i in range(0, rows, 128):
        part = torch.nn.functional.pad(x[..., i:i + 128, :].to(torch.float32),
                                       (0, bc * 128 - cols))
        r = part.shape[-2]
        blocks = part.reshape(shape[:-2] + (r, bc, 128))
        amax = blocks.abs().amax(dim=(-3, -1))
        scale = torch.where(amax == 0, torch.ones_like(amax), amax / 448.0)
        q = executor.e4m3_bits(blocks / scale.unsqueeze(-2).unsqueeze(-1))
        codes[..., i:i + r, :] = q.reshape(shape[:-2] + (r, bc * 128))[..., :cols]
        scales[..., i // 128, :] = scale
    return codes, scales


def e4m3_values():
    """Every non-negative finite e4m3 value, as float64, in code order."""
    codes = torch.arange(0, 0x7F)
    e, m = (codes >> 3) & 15, codes & 7
    return torch.where(e == 0, m.double() * 2.0 ** -9,
                       (1 + m.double() / 8) * torch.pow(2.0, (e - 7).double()))


def random_weights(g, shape, dtype):
    """Random values of `dtype` for the quantiser, per 128 x 128 block (from the origin)
    of magnitude m between 2^-30 and 2^12 (fp16: its range): Gaussian values times m,
    448 m at the block's first element (the block amax, so that the scale is m, a power
    of two: the next ones are ties after the division), e4m3 midpoints times m, values
    just below the amax, exact zeros, -0, values subnormal in `dtype`, all-zero tiles."""
    lo, hi = (-14, 5) if dtype == torch.float16 else (-30, 12)
    blocks = tuple(shape[:-2]) + tuple(-(-d // 128) for d in shape[-2:])
    mag = torch.exp2(torch.randint(lo, hi, blocks, generator=g).double())
    mag = mag.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :shape[-2], :shape[-1]]
    x = torch.randn(shape, generator=g, dtype=torch.float64) * mag
    pick = torch.rand(shape, generator=g)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
    mids = (e4m3_values()[1:] + e4m3_values()[:-1]) / 2
    tie = mids[torch.randint(0, len(mids), shape, generator=g)] * mag * sign
    tiny = torch.finfo(dtype).tiny * torch.rand(shape, generator=g, dtype=torch.float64)
    for (low, high), value in [((0.0, 0.2), tie), ((0.2, 0.25), torch.zeros_like(x)),
                               ((0.25, 0.3), 448 * mag * (1 - 2.0 ** -8) * sign),
                               ((0.3, 0.35), tiny * sign), ((0.35, 0.37), -torch.zeros_like(x))]:
        x = torch.where((pick >= low) & (pick < high), value, x)
    zero_tiles = torch.rand(tuple(shape[:-2]) + tuple(-(-d // 32) for d in shape[-2:]),
                            generator=g) < 0.1
    zero = zero_tiles.repeat_interleave(32, -2).repeat_interleave(32, -1)
    x = torch.where(zero[..., :shape[-2], :shape[-1]], torch.zeros_like(x), x)
    x[..., ::128, ::128] = 448 * mag[..., ::128, ::128]
    return x.to(dtype)


class PathCounter:
    """Counts the quantiser's calls by path: the native module's, and the torch path's
    chunks (the fast rounding, the per-element one)."""

    def __init__(self, monkeypatch):
        self.native = self.fast = self.reference = 0
        natively = executor._quantize_natively
        codes, reference = executor._Scratch.codes, executor._quantize_reference

        def native(x3, c3, s3):
            done = natively(x3, c3, s3)
            self.native += int(done)
            return done

        def fast(scratch, n, out):
            self.fast += 1
            codes(scratch, n, out)

        def slow(x, codes, scales):
            self.reference += 1
            reference(x, codes, scales)

        monkeypatch.setattr(executor, "_quantize_natively", native)
        monkeypatch.setattr(executor._Scratch, "codes", fast)
        monkeypatch.setattr(executor, "_quantize_reference", slow)


def has_native_quantizer():
    return executor._native_quantize() is not None


# The quantiser's paths: "default" (the native module's on CPU when it has the
# quantiser, else torch) and "torch" (the native one turned off).
QUANTIZER_PATHS = ["default", "torch"]


def use_path(monkeypatch, path):
    if path == "torch":
        monkeypatch.setattr(executor, "_native_quantize_fn", False)


@pytest.mark.parametrize("path", QUANTIZER_PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
def test_quantizer_matches_the_per_element_reference(dtype, path, monkeypatch):
    # Small chunks, so that chunks start at block rows and group whole matrices too.
    monkeypatch.setattr(executor, "_CHUNK_ELEMENTS", 3 * 128 * 128)
    use_path(monkeypatch, path)
    paths = PathCounter(monkeypatch)
    g = torch.Generator().manual_seed(20261126 + torch.finfo(dtype).bits)
    shapes = [(1, 1), (7, 300), (128, 128), (130, 260), (300, 1000), (384, 129),
              (3, 129, 384), (5, 64, 200), (2, 2, 131, 7)]
    for shape in shapes:
        x = random_weights(g, shape, dtype)
        want_codes, want_scales = reference_quantize_block128(x)
        codes, scales = executor.quantize_block128(x)
        assert torch.equal(codes, want_codes), (shape, dtype)
        assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32)), shape
        # A strided view (as the sender slices its tensor), into given buffers, and into
        # buffers that cannot be viewed in 3 dims (transposed).
        wide = random_weights(g, shape[:-1] + (shape[-1] + 70,), dtype)
        view = wide[..., 33:33 + shape[-1]]
        want_codes, want_scales = reference_quantize_block128(view)
        codes = torch.full(shape, 7, dtype=torch.uint8)
        scales = torch.full(executor.scale_shape(shape), 7.0)
        executor.quantize_block128(view, codes=codes, scales=scales)
        assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales), shape
        order = list(range(len(shape)))[::-1]  # [::-1]: strided, not viewable in 3 dims
        codes_t = torch.zeros([shape[d] for d in order], dtype=torch.uint8).permute(order)
        scale_dims = executor.scale_shape(shape)
        scales_t = torch.zeros([scale_dims[d] for d in order]).permute(order)
        executor.quantize_block128(view, codes=codes_t, scales=scales_t)
        assert torch.equal(codes_t, want_codes) and torch.equal(scales_t, want_scales)
    if path == "default" and has_native_quantizer():
        # Contiguous x natively (strided views of x in torch: their comparisons above
        # check the torch path's bytes against the same reference).
        assert paths.native >= len(shapes), vars(paths)
    else:
        assert paths.native == 0, vars(paths)
        assert paths.fast > 20 and paths.reference < paths.fast / 4, vars(paths)


def extreme_tensors():
    """Blocks whose scale underflows to 0 or is subnormal (fp32 inputs), or is a normal
    float below 2^-116 with subnormal inputs, +-inf values, NaNs of both signs and
    payloads (the scale torch's amax gives, x / NaN), bf16 subnormals."""
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(5))
    x[:128, :128] *= 2.0 ** -140  # scale subnormal: |x / scale| may pass 448
    x[:128, 128:256] = 0.0
    x[0:3, 128:131] = torch.tensor([2.0 ** -149, -2.0 ** -148, 3 * 2.0 ** -149])
    x[100, 300] = float("inf")
    x[101, 200] = -float("inf")
    x[255, 383] = 2.0 ** -149  # in a block of ordinary values (rows 128-255: all such)
    x[128:, 384:] *= 2.0 ** -112  # scales about 2^-118 with subnormal values in them
    x[130:140, 400:410] = 2.0 ** -127
    x.view(torch.int32)[10, 10] = 0x7FC00000
    x.view(torch.int32)[11, 11] = -0x00400000  # 0xFFC00000
    x.view(torch.int32)[12, 12] = 0x7FFFFFFF
    x.view(torch.int32)[13, 140] = 0x7F800001  # signalling
    b = torch.randn(256, 300, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    b[128:, 150:] = 2.0 ** -128  # bf16 subnormals: a subnormal scale
    b[200, 200] = -2.0 ** -133
    b.view(torch.int16)[5, 5] = -1  # NaN 0xFFFF
    h = torch.randn(130, 260, generator=torch.Generator().manual_seed(7)).to(torch.float16)
    h[0, 0] = float("inf")
    h.view(torch.int16)[129, 259] = 0x7C01  # signalling NaN
    h[:128, 128:256] *= 2.0 ** -14  # half subnormals
    return x, b, h


@pytest.mark.parametrize("path", QUANTIZER_PATHS)
def test_quantizer_blocks_with_extreme_scales_match_the_reference(path, monkeypatch):
    # The torch path: these blocks take the per-element formula, the others the fast one.
    monkeypatch.setattr(executor, "_CHUNK_ELEMENTS", 128 * 128)
    use_path(monkeypatch, path)
    paths = PathCounter(monkeypatch)
    for t in extreme_tensors():
        want_codes, want_scales = reference_quantize_block128(t)
        codes, scales = executor.quantize_block128(t)
        assert torch.equal(codes, want_codes)
        assert torch.equal(scales.view(torch.int32), want_scales.view(torch.int32))
    if path == "default" and has_native_quantizer():
        assert paths.native == 3, vars(paths)
    else:
        assert paths.fast > 0 and paths.reference > 0, vars(paths)


def test_native_and_torch_quantizers_give_the_same_bytes(monkeypatch):
    # Random seeded tensors of every dtype and several shapes, with the special values,
    # both ways (contiguous inputs; the default path then is the native one).
    if not has_native_quantizer():
        pytest.skip("rlsched._native has no quantize_block128 (an older or partial build)")
    g = torch.Generator().manual_seed(20261207)
    cases = list(extreme_tensors())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for shape in [(1, 1), (127, 129), (300, 1000), (3, 129, 384), (2, 2, 131, 7)]:
            x = random_weights(g, shape, dtype)
            special = torch.rand(shape, generator=g) < 0.001
            x[special] = float("inf") if dtype != torch.float32 else float("nan")
            cases.append(x)
    for x in cases:
        native = executor.quantize_block128(x)
        with monkeypatch.context() as m:
            m.setattr(executor, "_native_quantize_fn", False)
            torch_path = executor.quantize_block128(x)
        assert torch.equal(native[0], torch_path[0]), (x.dtype, tuple(x.shape))
        assert torch.equal(native[1].view(torch.int32), torch_path[1].view(torch.int32))
    # A parameter that requires grad (as a module's state dict holds them): natively too.
    paths = PathCounter(monkeypatch)
    w = torch.nn.Parameter(cases[-1].float())
    codes, scales = executor.quantize_block128(w)
    assert paths.native == 1
    want = reference_quantize_block128(w.detach())
    assert torch.equal(codes, want[0]) and torch.equal(scales.view(torch.int32),
                                                       want[1].view(torch.int32))


def test_strided_inputs_are_quantised_natively_a_strip_at_a_time(monkeypatch):
    # Column slices and transposes (a sender's slice of its tensor, a gather rectangle):
    # copied a strip of block rows at a time (strips of 128 rows here), the bytes those
    # of the torch path.
    if not has_native_quantizer():
        pytest.skip("rlsched._native has no quantize_block128 (an older or partial build)")
    monkeypatch.setattr(executor, "_CHUNK_ELEMENTS", 128 * 64)
    g = torch.Generator().manual_seed(20261126)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        full = random_weights(g, (2, 400, 700), dtype)
        full[0, 130:140, 300:310] = 2.0 ** -120  # a block of tiny values: a tiny scale
        for x in (full[1, :, 200:584], full[0].t(), full[:, 3:397:2, 10:300]):
            assert not x.is_contiguous()
            paths = PathCounter(monkeypatch)
            native = executor.quantize_block128(x)
            assert paths.native == 1 and paths.fast == paths.reference == 0, vars(paths)
            with monkeypatch.context() as m:
                m.setattr(executor, "_native_quantize_fn", False)
                torch_path = executor.quantize_block128(x)
            assert torch.equal(native[0], torch_path[0]), (dtype, tuple(x.shape))
            assert torch.equal(native[1].view(torch.int32), torch_path[1].view(torch.int32))


def test_native_quantizer_names_the_bad_argument():
    if not has_native_quantizer():
        pytest.skip("rlsched._native has no quantize_block128 (an older or partial build)")
    import numpy as np
    from rlsched import _native

    x = np.zeros((130, 260), np.float32)
    codes, scales = np.zeros(x.shape, np.uint8), np.zeros((2, 3), np.float32)
    _native.quantize_block128(x, codes, scales)
    assert (scales == 1).all() and (codes == 0).all()
    bad = [({"x": np.zeros(3, np.float32)}, "x"), ({"x": x.astype(np.int16)}, "x"),
           ({"x": x.astype(np.float64)}, "x"), ({"x": x.astype(">f4")}, "x"),
           ({"x": np.zeros((260, 130), np.float32).T}, "x"),
           ({"x": x.view(np.int16)[:, :260], "dtype": "fp8"}, "dtype"),
           ({"codes": codes.astype(np.int8)}, "codes"), ({"codes": codes[:, :-1]}, "codes"),
           ({"codes": np.zeros((260, 130), np.uint8).T}, "codes"),
           ({"scales": np.zeros((2, 4), np.float32)}, "scales"),
           ({"scales": scales.astype(np.float64)}, "scales")]
    readonly = scales.copy()
    readonly.flags.writeable = False
    bad.append(({"scales": readonly}, "scales"))
    # Arrays that share memory: the codes over x's bytes, the scales over x's or codes'.
    memory = np.zeros(x.nbytes + codes.nbytes, np.uint8)
    over_x = memory[:x.nbytes].view(np.float32).reshape(x.shape)
    bad.append(({"x": over_x, "codes": memory[x.nbytes - 5:][:codes.size].reshape(x.shape)},
                "codes"))
    bad.append(({"x": over_x, "scales": memory[:scales.nbytes].view(np.float32).reshape(2, 3)},
                "scales"))
    bad.append(({"codes": memory[:codes.size].reshape(x.shape),
                 "scales": memory[100:100 + scales.nbytes].view(np.float32).reshape(2, 3)},
                "scales"))
    for change, field in bad:
        args = {"x": x, "codes": codes, "scales": scales, "dtype": None}
        args.update(change)
        with pytest.raises(ValueError) as error:
            _native.quantize_block128(**args)
        assert error.value.field == field, (change, str(error.value))


def test_fast_rounding_matches_e4m3_bits():
    # Every e4m3 value, every midpoint and its float32 neighbours, +-0, float32
    # subnormals and random bit patterns up to 448 (1 + 2^-22) in magnitude: the
    # quantiser's rounding (for values of blocks with normal scales) gives e4m3_bits.
    values = e4m3_values().float()
    mids = ((e4m3_values()[1:] + e4m3_values()[:-1]) / 2).float()
    g = torch.Generator().manual_seed(11)
    random_bits = torch.randint(0, 0x43E00003, (200000,), generator=g, dtype=torch.int32)
    y = torch.cat([values, mids, torch.nextafter(mids, torch.zeros(1)),
                   torch.nextafter(mids, torch.full((1,), 500.0)),
                   torch.tensor([0.0, 2.0 ** -149, 2.0 ** -127, 2.0 ** -10, 448.0]),
                   random_bits.view(torch.float32)])
    y = torch.cat([y, -y])
    want = executor.e4m3_bits(y)
    scratch = executor._Scratch(y.numel(), y.device)
    assert scratch.np is not None  # numpy's shifts on CPU
    for shifts in ("numpy", "torch"):
        if shifts == "torch":
            scratch.np = None  # as on other devices
        scratch.y.copy_(y)
        codes = torch.empty(y.numel(), dtype=torch.uint8)
        scratch.codes(y.numel(), codes)
        assert torch.equal(codes, want), shifts


@pytest.mark.skipif(os.environ.get("RLSCHED_THOROUGH") != "1",
                    reason="every float32 up to 448: minutes (RLSCHED_THOROUGH=1)")
def test_fast_rounding_matches_e4m3_bits_on_every_float32():
    # All 2.28e9 float32 values of magnitude up to 448 (1 + 2^-22) and a few ulps past,
    # both signs (zeros, subnormals): the fast rounding gives e4m3_bits.
    n = 1 << 24
    scratch = executor._Scratch(n, "cpu")
    codes = torch.empty(n, dtype=torch.uint8)
    for sign in (0, -0x80000000):
        for start in range(0, 0x43E00004 + 1, n):
            stop = min(start + n, 0x43E00004 + 1)
            y = (torch.arange(start, stop, dtype=torch.int64) + sign).to(torch.int32).view(
                torch.float32)
            scratch.y[:len(y)].copy_(y)
            scratch.codes(len(y), codes[:len(y)])
            assert torch.equal(codes[:len(y)], executor.e4m3_bits(y)), hex(start)


@pytest.mark.parametrize("path", QUANTIZER_PATHS)
def test_quantizer_with_subnormals_flushed(path, monkeypatch):
    # torch.set_flush_denormal(True) breaks the torch path's fast rounding: it notices
    # and uses the per-element formula, so the bytes stay the reference's computed in
    # the same mode. The native quantiser does not depend on the mode: its bytes are the
    # reference's in the default mode (where they differ from the flushed ones).
    use_path(monkeypatch, path)
    native = path == "default" and has_native_quantizer()
    x = random_weights(torch.Generator().manual_seed(3), (200, 300), torch.bfloat16)
    tiny = torch.randn(128, 256, generator=torch.Generator().manual_seed(4)) * 2.0 ** -112
    tiny[5:9, 5:9] = 2.0 ** -127  # subnormal values of a block whose scale is about 2^-118
    unflushed = [reference_quantize_block128(t) for t in (x, tiny)]
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        assert not executor._subnormals_kept()
        flushed = [reference_quantize_block128(t) for t in (x, tiny)]
        got = [executor.quantize_block128(t) for t in (x, tiny)]
    finally:
        torch.set_flush_denormal(False)
    assert executor._subnormals_kept()
    assert not torch.equal(flushed[1][0], unflushed[1][0])  # the mode matters there
    for (codes, scales), want in zip(got, unflushed if native else flushed):
        assert torch.equal(codes, want[0]) and torch.equal(scales, want[1])


def test_block_rectangles_cover_each_block_once():
    # Random block masks (dense, sparse, the same or different per leading index): the
    # rectangles the engine quantises cover every True block once and no other.
    g = torch.Generator().manual_seed(13)
    for shape in [(1, 1), (3, 4), (6, 1), (2, 5, 3), (4, 3, 7), (2, 2, 4, 4)]:
        for density in (0.1, 0.5, 0.9, 1.0):
            mask = torch.rand(shape, generator=g) < density
            if len(shape) > 2 and density == 0.5:
                mask[...] = mask.reshape((-1,) + shape[-2:])[0]  # the same everywhere
            count = torch.zeros(shape, dtype=torch.int32)
            for lead, (r0, r1), (c0, c1) in executor._block_rectangles(mask):
                assert r0 < r1 and c0 < c1
                count[lead + (slice(r0, r1), slice(c0, c1))] += 1
            assert torch.equal(count, mask.int()), (shape, density)


def wider(tmp_path, family, **sizes):
    cfg = json.load(open(config(family)))
    cfg.update(sizes)
    path = tmp_path / f"wide-{family}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


# Dims of a few 128-blocks, so that plans quantise at the sender (whole blocks) and at
# the destination (straddling slices).
FP8_WORLDS = [
    ("llama", dict(hidden_size=256, intermediate_size=1024, vocab_size=1000),
     {"tp": 2}, {"tp": 1}, False),
    ("qwen3-moe", dict(hidden_size=256, moe_intermediate_size=384, num_attention_heads=8,
                       num_key_value_heads=4, head_dim=64),
     {"tp": 2, "ep": 2, "dp": 2}, {"tp": 2, "ep": True, "replicas": 2}, True),
    ("deepseek-v3", dict(hidden_size=256, moe_intermediate_size=256, q_lora_rank=192,
                         kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16,
                         v_head_dim=32),
     {"tp": 2, "pp": 2}, {"tp": 2, "replicas": 2}, True),
]


# Each world packs its small transfers (the 1 MiB default), then moves every transfer
# alone (direct_min_bytes 1: the senders' codes alone, straight into the destination
# where its slice is contiguous, their scales packed), over three syncs with kept
# staging for the latter.
@pytest.mark.parametrize("family,sizes,train,infer,colocated,alone",
                         [w + (a,) for w in FP8_WORLDS for a in (False, True)],
                         ids=[f"{w[0]}-{'alone' if a else 'packed'}" for w in FP8_WORLDS
                              for a in (False, True)])
def test_fp8_byte_exact(tmp_path, family, sizes, train, infer, colocated, alone):
    kw = dict(direct_min_bytes=1, syncs=3, keep_staging=True) if alone else {}
    s = launcher.run(wider(tmp_path, family, **sizes), train, infer, colocated=colocated,
                     check=True, bucket_mib=1, timeout=60, target_dtype="fp8",
                     plan_format="binpb" if family == "qwen3-moe" else "json", **kw)
    assert "refused" not in s and "error" not in s, s.get("refused") or s.get("error")
    assert s["check"]["ok"], s["check"]["problems"]
    assert s["quantized_at_sender"] > 0 and s["quantized_at_destination"] > 0
    assert s["bytes_moved"] == s["plan"]["bytes_moved"]
    assert s["bytes_received"] + s["bytes_local"] == s["plan"]["bytes_received"]
    assert (s["direct_collectives"] > 0) == alone


def test_fp8_a_colocated_sender_that_also_receives(tmp_path):
    # A colocated plan whose local copies are merged into the sender's transfer of the
    # same slice to the other engine: the sender takes its own slice as it packed it
    # (codes and scales, bf16 to gather, or plain), packed and moving alone.
    model = wider(tmp_path, "llama", hidden_size=256, intermediate_size=1024, vocab_size=1000)
    path = str(tmp_path / "merged.json")
    launcher.plan_with_rlsched(os.environ["RLSCHED_BIN"], model, {"tp": 2},
                               {"tp": 1, "replicas": 2}, True, 1, path,
                               target_dtype="fp8_block128")
    plan = json.load(open(path))

    def key(t):
        return (t.get("bucket", 0), t.get("src_rank", 0), t["src_param"],
                json.dumps(t.get("src_slice")), t["dst_param"], json.dumps(t.get("dst_slice")))

    local = {key(t): t for t in plan["transfers"] if t["dst_ranks"] == [t.get("src_rank", 0)]}
    merged, kinds = [], set()
    for t in plan["transfers"]:
        if t["dst_ranks"] != [t.get("src_rank", 0)] and key(t) in local:
            t["dst_ranks"] = sorted(t["dst_ranks"] + [t.get("src_rank", 0)])
            kinds.add(t.get("quantize", "QUANTIZE_NONE"))
            merged.append(local.pop(key(t)))
    assert len(kinds) == 3  # every way of quantising
    plan["transfers"] = [t for t in plan["transfers"] if not any(t is m for m in merged)]
    plan["num_transfers"] = len(plan["transfers"])
    with open(path, "w") as f:
        json.dump(plan, f)
    for direct in (None, 1):
        s = launcher.run(model, {"tp": 2}, {"tp": 1, "replicas": 2}, colocated=True,
                         check=True, plan_path=path, timeout=60, target_dtype="fp8",
                         direct_min_bytes=direct)
        assert "refused" not in s and "error" not in s, s.get("refused") or s.get("error")
        assert s["check"]["ok"], s["check"]["problems"]
        assert s["bytes_local"] > 0 and s["quantized_at_sender"] > 0


def test_float32_of_reads_packed_scales_at_any_offset():
    # Scales packed after codes of any length start at any byte offset of the staging
    # buffer: read in place where 4-aligned, copied where not, the same values.
    g = torch.Generator().manual_seed(5)
    values = torch.randn(37, generator=g) * 1e-3
    for offset in range(8):
        buffer = torch.zeros(offset + 4 * 37 + 3, dtype=torch.uint8)
        buffer[offset:offset + 4 * 37] = values.view(torch.uint8)
        packed = buffer[offset:offset + 4 * 37]
        got = executor._float32_of(packed)
        assert torch.equal(got.view(torch.int32), values.view(torch.int32))
        in_place = executor._float32_of(packed, copy=False)
        assert (in_place is not None) == (offset % 4 == 0)
        if in_place is not None:  # a view: writes land in the buffer
            in_place[0] = 2.0
            assert torch.equal(buffer[offset:offset + 4], torch.tensor([2.0]).view(torch.uint8))


def test_packed_fp8_slices_have_the_quantisers_bytes_at_any_offset():
    # A sender packs a slice's codes, then its float32 scales right after them: codes of
    # any length put the scales at any byte offset (written in place where 4-aligned,
    # copied in where not).
    import types
    g = torch.Generator().manual_seed(8)
    alignments = set()
    for rows, cols in [(3, 5), (130, 7), (128, 129), (2, 2)]:
        src = torch.randn(rows, cols, generator=g).to(torch.bfloat16)
        want_codes, want_scales = executor.quantize_block128(src)
        t = types.SimpleNamespace(dst_slice=((0, rows), (5, 5 + cols)))
        n, blocks = rows * cols, executor._fp8_geometry(t)[2]
        for offset in range(8):
            buffer = torch.zeros(offset + n + 4 * blocks + 3, dtype=torch.uint8)
            codes = buffer[offset:offset + n]
            scales = buffer[offset + n:offset + n + 4 * blocks]
            executor.Executor._pack_fp8(None, t, src, codes, scales)
            assert torch.equal(codes.view(rows, cols), want_codes)
            assert torch.equal(executor._float32_of(scales).view(torch.int32),
                               want_scales.reshape(-1).view(torch.int32))
            alignments.add((offset + n) % 4 == 0)
    assert alignments == {True, False}


def _next_rows(s, rows):
    """Slice `s` moved to the `rows` rows after its own (the first dim)."""
    return ((s[0][1], s[0][1] + rows),) + s[1:]


def random_transfers(rng, n, ranks=4):
    """`n` transfers of a made-up plan over `ranks` ranks: a few buckets, quantised by
    the sender (whole blocks), by the destination or not at all, of random sizes."""
    out = []
    for i in range(n):
        if out and rng.random() < 0.4:  # the next rows of the previous one's tensors
            p = out[-1]
            rows = rng.choice((64, 128, 256))
            blocks = -(-rows // 128) * -(-(p.dst_slice[1][1] - p.dst_slice[1][0]) // 128)
            cols = p.dst_slice[1][1] - p.dst_slice[1][0]
            nbytes = (rows * cols + 4 * blocks if p.quantize == executor.QUANTIZE_AT_SENDER
                      else 2 * rows * cols)
            out.append(dataclasses.replace(p, index=i, src_slice=_next_rows(p.src_slice, rows),
                                           dst_slice=_next_rows(p.dst_slice, rows),
                                           bytes=nbytes))
            continue
        src = rng.randrange(ranks)
        dst = tuple(sorted(rng.sample(range(ranks), rng.randint(1, 3))))
        q = rng.choice((executor.QUANTIZE_NONE, executor.QUANTIZE_AT_SENDER,
                        executor.QUANTIZE_AT_DESTINATION))
        rows, cols = rng.choice((1, 64, 128, 300)), rng.choice((16, 128, 256, 1000))
        r0, c0 = rng.randrange(3) * 128, rng.randrange(3) * 128
        sl = ((r0, r0 + rows), (c0, c0 + cols))
        blocks = -(-rows // 128) * -(-cols // 128)
        nbytes = rows * cols + 4 * blocks if q == executor.QUANTIZE_AT_SENDER else 2 * rows * cols
        out.append(executor.Transfer(index=i, bucket=rng.randrange(3), src_rank=src,
                                     src_param=f"s{i % 3}", src_slice=sl, dst_ranks=dst,
                                     dst_param=f"d{i % 4}", dst_slice=sl, bytes=nbytes,
                                     quantize=q))
    rng.shuffle(out)
    return out


def test_schedule_moves_every_byte_once_in_one_order():
    # Random plans and thresholds: every transfer's bytes in exactly one collective
    # (whole) or two (its codes alone, then its scales packed after them, same bucket
    # and ranks); packed parts aligned and apart; tags unique; each rank's own part of
    # the plan scheduled as the collectives of the whole plan it takes part in.
    import random
    rng = random.Random(7)
    joined = 0  # single collectives of several transfers
    for case in range(60):
        transfers = random_transfers(rng, rng.randint(1, 40))
        threshold = rng.choice((None, 0, 1, 4096, 1 << 20))
        cs = [c for b in executor.schedule(transfers, threshold) for c in b]
        carried, where = {}, {}
        for k, c in enumerate(cs):
            assert c.size == (c.offsets[-1] + c.sizes[-1] if c.offsets else 0)
            for t, part, offset, size in zip(c.transfers, c.parts, c.offsets, c.sizes):
                assert (c.direct or offset % 8 == 0) and size == executor.part_bytes(t, part)
                assert (c.bucket, c.src, c.dst_ranks) == (t.bucket, t.src_rank, t.dst_ranks)
                carried[t.index] = carried.get(t.index, 0) + size
                where.setdefault(t.index, {})[part] = k
            ends = [o + n for o, n in zip(c.offsets, c.sizes)]
            assert all(e <= o for e, o in zip(ends, c.offsets[1:]))
            if c.direct:  # one slice of the tensors: back to back, each continuing the last
                joined += len(c.transfers) > 1
                assert len(set(c.parts)) == 1 and c.parts[0] != executor.PART_SCALES
                assert c.offsets[0] == 0 and ends[:-1] == c.offsets[1:]
                for a, b in zip(c.transfers, c.transfers[1:]):
                    assert b.dst_param == a.dst_param and b.dst_slice[0][0] == a.dst_slice[0][1]
                    assert b.dst_slice[1:] == a.dst_slice[1:]
                    if c.parts[0] == executor.PART_WHOLE:
                        assert b.src_param == a.src_param
                        assert b.src_slice[0][0] == a.src_slice[0][1]
                        assert b.src_slice[1:] == a.src_slice[1:]
        assert carried == {t.index: t.bytes for t in transfers}, case
        for t in transfers:
            parts = where[t.index]
            alone = (threshold is not None and t.dst_ranks != (t.src_rank,))
            if parts.keys() == {executor.PART_WHOLE}:
                assert not (alone and t.quantize == executor.QUANTIZE_AT_SENDER
                            and t.elements >= threshold)
                continue
            assert alone and t.quantize == executor.QUANTIZE_AT_SENDER
            assert parts[executor.PART_CODES] < parts[executor.PART_SCALES]
        tags = [c.tag for c in cs]
        assert len(tags) == len(set(tags))
        for rank in range(4):
            mine = [t for t in transfers if t.src_rank == rank or rank in t.dst_ranks]
            want = [(c.tag, c.size) for c in cs if c.src == rank or rank in c.dst_ranks]
            got = [(c.tag, c.size) for b in executor.schedule(mine, threshold) for c in b]
            assert got == want
    assert joined > 0


def test_gather_region_holds_the_slices_and_their_blocks():
    # Random slices of random fp8 tensors: the region starts and ends on blocks (or the
    # tensor's edge), holds every slice, and the rectangles cover exactly the blocks
    # the slices touch, inside the region.
    import random
    rng = random.Random(11)
    for case in range(200):
        lead = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 1)))
        rows, cols = rng.randint(1, 700), rng.randint(1, 700)
        slices = []
        for _ in range(rng.randint(1, 5)):
            r0, c0 = rng.randrange(rows), rng.randrange(cols)
            r1, c1 = rng.randint(r0 + 1, rows), rng.randint(c0 + 1, cols)
            head = tuple((i, i + 1) for i in (rng.randrange(d) for d in lead))
            slices.append(head + ((r0, r1), (c0, c1)))
        (r_lo, c_lo), shape, rectangles = executor._gather_region(lead + (rows, cols), slices)
        assert r_lo % 128 == 0 and c_lo % 128 == 0 and shape[:-2] == lead
        r_hi, c_hi = r_lo + shape[-2], c_lo + shape[-1]
        assert r_hi == rows or r_hi % 128 == 0
        assert c_hi == cols or c_hi % 128 == 0
        touched = torch.zeros(executor.scale_shape(lead + (rows, cols)), dtype=torch.int32)
        for s in slices:
            assert r_lo <= s[-2][0] and s[-2][1] <= r_hi and c_lo <= s[-1][0] and s[-1][1] <= c_hi
            touched[tuple(slice(b, e) for b, e in s[:-2]) + (
                slice(s[-2][0] // 128, -(-s[-2][1] // 128)),
                slice(s[-1][0] // 128, -(-s[-1][1] // 128)))] = 1
        count = torch.zeros_like(touched)
        for index, (b0, b1), (d0, d1) in rectangles:
            assert r_lo <= b0 * 128 and min(b1 * 128, rows) <= r_hi
            assert c_lo <= d0 * 128 and min(d1 * 128, cols) <= c_hi
            count[index + (slice(b0, b1), slice(d0, d1))] += 1
        assert torch.equal(count, touched), case


def test_fp8_destinations_must_hold_bits_and_scales(tmp_path):
    path = str(tmp_path / "fp8.json")
    launcher.plan_with_rlsched(os.environ["RLSCHED_BIN"], config("llama"), {"tp": 1},
                               {"tp": 1}, False, 1, path, target_dtype="fp8_block128")
    part = executor.load_plan(path, 1)  # the engine rank
    model = lay.parse_config(open(config("llama")).read())
    bf16 = lay.vllm_shards(model, lay.Infer(), 0, lay.full_tensors(model))
    problems = executor.check_plan(part, 2, {}, bf16)
    assert problems and {f for _, f, _ in problems} == {"dst_param"}
    assert "torch.uint8" in problems[0][2]
    fp8 = {k: (torch.zeros(v.shape, dtype=torch.uint8) if lay.is_linear(k) else v)
           for k, v in bf16.items()}
    problems = executor.check_plan(part, 2, {}, fp8)
    assert problems and "_scale_inv' must be float32" in problems[0][2]
    fp8.update({executor.scale_name(k): torch.zeros(executor.scale_shape(v.shape))
                for k, v in bf16.items() if lay.is_linear(k)})
    assert executor.check_plan(part, 2, {}, fp8) == []
    assert {f for _, f, _ in executor.check_plan(part, 2, {}, None)} == {"destinations"}


def test_command_line_json_summary():
    env = dict(os.environ)
    done = subprocess.run(
        [sys.executable, "-m", "rlsched.weight_sync.launcher", "--model", config("deepseek-v3"),
         "--train", "tp=2,ep=2", "--infer", "tp=2,ep", "--plan-format", "binpb", "--check",
         "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    assert s["ok"] and s["check"]["ok"] and s["ranks"] == 4
    assert s["bytes_moved"] == s["plan"]["bytes_moved"] > 0 and s["seconds"] > 0
    bad = subprocess.run([sys.executable, "-m", "rlsched.weight_sync.launcher", "--model",
                          config("llama"), "--train", "tp=2,xp=1", "--infer", "tp=1"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "train: unknown key 'xp'" in bad.stderr


# ---------------------------------------------------------------------------------
# Random plans on a 4-rank colocated gloo world, every rank's destinations against the
# bytes computed in the test: row bands of a bf16 tensor (moved whole) and of an fp8
# one (quantised by the sender, whole or cut at a block column, or by the destination,
# cut anywhere and sent by several ranks), partial blocks in both dims, broadcasts to
# sets that include the sender, consecutive bands of the same ranks (single collectives
# that join them: whole, or the senders' codes alone), several thresholds.

_WORLD_RANKS, _WORLD_ROWS, _WORLD_COLS = 4, 520, 400


def _world_source(rank, name):
    g = torch.Generator().manual_seed(1000 * rank + "AB".index(name))
    x = torch.randn(_WORLD_ROWS, _WORLD_COLS, generator=g)
    x[:64, :64] *= 2.0 ** -120  # a block of a tiny scale
    return x.to(torch.bfloat16)


def _world_plan(seed):
    import random
    rng = random.Random(seed)
    out = []

    def add(bucket, src, name, sl, dsts, dst, q):
        rows, cols = sl[0][1] - sl[0][0], sl[1][1] - sl[1][0]
        nbytes = (rows * cols + 4 * -(-rows // 128) * -(-cols // 128)
                  if q == executor.QUANTIZE_AT_SENDER else 2 * rows * cols)
        out.append(executor.Transfer(index=len(out), bucket=bucket, src_rank=src, src_param=name,
                                     src_slice=sl, dst_ranks=dsts, dst_param=dst, dst_slice=sl,
                                     bytes=nbytes, quantize=q))

    def receivers():
        """Every rank in one of 1-3 random sets (so that every rank's destinations are
        written exactly once), each set with its own bucket, sender (in the set or not)
        and source tensor."""
        ranks = rng.sample(range(_WORLD_RANKS), _WORLD_RANKS)
        cuts = sorted(rng.sample(range(1, _WORLD_RANKS), rng.randint(0, 2)))
        return [(rng.randrange(2), rng.randrange(_WORLD_RANKS), tuple(sorted(ranks[a:b])),
                 rng.choice("AB")) for a, b in zip([0] + cuts, cuts + [_WORLD_RANKS])]

    def band(dst, r, h, ranks):
        bucket, src, dsts, name = ranks
        q = (executor.QUANTIZE_NONE if dst == "P" else executor.QUANTIZE_AT_SENDER
             if rng.random() < 0.6 else executor.QUANTIZE_AT_DESTINATION)
        if q != executor.QUANTIZE_AT_DESTINATION:
            cut = rng.choice((None, 128, 256)) if dst == "Q" else None
            for c0, c1 in [(0, _WORLD_COLS)] if cut is None else [(0, cut), (cut, _WORLD_COLS)]:
                add(bucket, src, name, ((r, r + h), (c0, c1)), dsts, dst, q)
        else:
            rc, cc = r + rng.randrange(1, h), rng.randrange(1, _WORLD_COLS)
            for a, b in ((r, rc), (rc, r + h)):
                for c0, c1 in ((0, cc), (cc, _WORLD_COLS)):
                    sender = src if rng.random() < 0.5 else rng.randrange(_WORLD_RANKS)
                    add(bucket, sender, name, ((a, b), (c0, c1)), dsts, dst, q)

    for dst in ("P", "Q"):
        r, sets = 0, None
        while r < _WORLD_ROWS:
            h = min(_WORLD_ROWS - r, rng.choice((128, 128, 256)))
            if sets is None or rng.random() < 0.4:  # else the same as the previous band
                sets = receivers()
            for ranks in sets:
                band(dst, r, h, ranks)
            r += h
    return out


def _world_rank(rank, store, cases, results):
    import datetime
    import traceback

    import torch.distributed as dist
    out = {"rank": rank, "bad": []}
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=dist.FileStore(store, _WORLD_RANKS), rank=rank,
                                world_size=_WORLD_RANKS, timeout=datetime.timedelta(seconds=60))
        shape = (_WORLD_ROWS, _WORLD_COLS)
        for seed, threshold in cases:
            transfers = _world_plan(seed)
            mine = [t for t in transfers if t.src_rank == rank or rank in t.dst_ranks]
            plan = executor.RankPlan(rank=rank, trainer_ranks=_WORLD_RANKS,
                                     engine_ranks=_WORLD_RANKS, num_buckets=2,
                                     world_size=_WORLD_RANKS, colocated=True, transfers=mine,
                                     summary={})
            dst = {"P": torch.zeros(shape, dtype=torch.bfloat16),
                   "Q": torch.zeros(shape, dtype=torch.uint8),
                   "Q_scale_inv": torch.zeros(executor.scale_shape(shape))}
            executor.execute(plan, {n: _world_source(rank, n) for n in "AB"}, dst,
                             direct_min_bytes=threshold, timeout=datetime.timedelta(seconds=60))
            # What this rank should hold: its slices of the senders' tensors, the fp8
            # tensor quantised whole (blocks are whole in one way of quantising).
            want = {n: torch.zeros(shape, dtype=torch.bfloat16) for n in "PQ"}
            got = {n: torch.zeros(shape, dtype=torch.bool) for n in "PQ"}
            for t in transfers:
                if rank in t.dst_ranks:
                    sl = tuple(slice(b, e) for b, e in t.dst_slice)
                    want[t.dst_param][sl] = _world_source(t.src_rank, t.src_param)[sl]
                    got[t.dst_param][sl] = True
            codes, scales = reference_quantize_block128(want["Q"])
            blocks = torch.nn.functional.max_pool2d(got["Q"][None].float(), 128,
                                                    ceil_mode=True)[0].bool()
            if not torch.equal(dst["P"][got["P"]].view(torch.int16),
                               want["P"][got["P"]].view(torch.int16)):
                out["bad"].append((seed, threshold, "bf16"))
            if not torch.equal(dst["Q"][got["Q"]], codes[got["Q"]]):
                out["bad"].append((seed, threshold, "codes"))
            if not torch.equal(dst["Q_scale_inv"][blocks].view(torch.int32),
                               scales[blocks].view(torch.int32)):
                out["bad"].append((seed, threshold, "scales"))
    except Exception:  # any: reported to the test
        out["error"] = traceback.format_exc()
    results.put(out)


def test_random_plans_on_a_colocated_world_give_the_exact_bytes(tmp_path):
    import multiprocessing
    import queue
    thresholds = (None, 1, 4096, 1 << 20, 60000)
    cases = [(20261208 + i, thresholds[i % len(thresholds)]) for i in range(10)]
    # The plans exercise what they are meant to: single collectives of several
    # transfers, whole and codes alone, and gathers from several senders.
    joined, codes_alone = 0, 0
    for seed, threshold in cases:
        cs = [c for b in executor.schedule(_world_plan(seed), threshold) for c in b]
        joined += sum(c.direct and len(c.transfers) > 1 for c in cs)
        codes_alone += sum(c.direct and c.parts[0] == executor.PART_CODES for c in cs)
    assert joined > 0 and codes_alone > 0
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_world_rank, daemon=True,
                         args=(r, str(tmp_path / "store"), cases, results))
             for r in range(_WORLD_RANKS)]
    for p in procs:
        p.start()
    outs = []
    try:
        while len(outs) < _WORLD_RANKS:
            outs.append(results.get(timeout=120))
    except queue.Empty:
        pytest.fail(f"{_WORLD_RANKS - len(outs)} ranks gave no result within 120 s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for o in sorted(outs, key=lambda o: o["rank"]):
        assert "error" not in o, o["error"]
        assert not o["bad"], o
