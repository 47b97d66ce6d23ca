"""rlsched.plan_step_indices: the step plan as [rank][micro_batch] index lists.

On seeded random inputs the lists are those of `rlsched plan-step --json` for the same
lengths and options (the program's output, ranks[r].micro_batches[k].indices), with the
token cost and the attention cost model (in process through the wire library when the
native module has it); every index is placed exactly once, no micro-batch exceeds the
cap, every rank has the same micro-batch count; numpy output; errors name the argument.
"""

import json
import os
import random
import subprocess

import pytest

import rlsched

np = pytest.importorskip("numpy")

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "configs")
QWEN3_MOE = os.path.join(CONFIGS, "qwen3-30b-a3b.json")

MODEL = {"hidden_size": 4096, "num_layers": 32, "ffn_hidden_size": 14336,
         "num_attention_heads": 32, "num_kv_heads": 8, "vocab_size": 128256}
MODEL_FLAGS = ["--cost", "attention", "--hidden-size", "4096", "--num-layers", "32",
               "--ffn-hidden-size", "14336", "--num-attention-heads", "32",
               "--num-kv-heads", "8", "--vocab-size", "128256"]

CASES = [
    # (seed, n, ranks, cap, keyword options, the program's flags)
    (1, 200, 4, 40000, {}, []),
    (2, 1000, 8, 32768, {"pipeline_model_parallel_size": 4},
     ["--pipeline-model-parallel-size", "4"]),
    (3, 300, 2, 33000, {"min_micro_batches": 3, "micro_batches_multiple_of": 2,
                        "pad_to_multiple_of": 128, "overhead": 0},
     ["--min-micro-batches", "3", "--micro-batches-multiple-of", "2",
      "--pad-to-multiple-of", "128", "--overhead", "0"]),
    (4, 257, 4, 50000, {"order": "heaviest_first", "equal_size": True, "count_tolerance": 0.05},
     ["--order", "heaviest-first", "--equal-size", "--count-tolerance", "0.05"]),
    (5, 3, 4, 40000, {}, []),  # fewer sequences than ranks: empty ranks
    (6, 500, 8, 65536, {"cost": {"kind": "attention", "model": MODEL}}, MODEL_FLAGS),
    (7, 64, 2, 20000, {"cost": {"kind": "attention", "model": MODEL}, "overhead": 500},
     MODEL_FLAGS + ["--overhead", "500"]),
    # Sequences above the cap, each alone (lengths drawn up to twice the cap).
    (8, 300, 4, 16000, {"oversize": "alone"}, ["--oversize", "alone"]),
    (9, 120, 2, 9000, {"oversize": "alone", "pad_to_multiple_of": 64,
                       "cost": {"kind": "attention", "model": MODEL}},
     ["--oversize", "alone", "--pad-to-multiple-of", "64"] + MODEL_FLAGS),
    # The cost of a Hugging Face config's architecture (an MoE model).
    (10, 400, 8, 32768, {"model": QWEN3_MOE}, ["--model", QWEN3_MOE]),
]


def _lengths(seed, n, cap, oversize=False):
    rng = random.Random(seed)
    return [rng.randint(1, 2 * cap if oversize else min(cap, 32768)) for _ in range(n)]


def _program_plan(rlsched_bin, lengths, ranks, cap, flags):
    result = subprocess.run(
        [rlsched_bin, "plan-step", "--ranks", str(ranks), "--max-token-len", str(cap),
         "--json", *flags], input="\n".join(map(str, lengths)) + "\n",
        capture_output=True, text=True, timeout=120, check=True)
    reply = json.loads(result.stdout)
    return [[[int(i) for i in m.get("indices", [])] for m in r.get("micro_batches", [])]
            for r in reply["ranks"]]


@pytest.mark.parametrize("seed,n,ranks,cap,options,flags", CASES)
def test_same_lists_as_the_program(rlsched_bin, seed, n, ranks, cap, options, flags):
    alone = options.get("oversize") == "alone"
    lengths = _lengths(seed, n, cap, alone)
    plan = rlsched.plan_step_indices(lengths, ranks, cap, **options)
    assert plan == _program_plan(rlsched_bin, lengths, ranks, cap, flags)
    # Every index once; the cap holds (padded lengths) but for a sequence above it
    # alone; one count on every rank.
    assert sorted(i for rank in plan for m in rank for i in m) == list(range(n))
    pad = options.get("pad_to_multiple_of", 1)
    alone_seen = 0
    for rank in plan:
        assert len(rank) == len(plan[0])
        for m in rank:
            assert m == sorted(m)
            if len(m) == 1 and -(-lengths[m[0]] // pad) * pad > cap:
                alone_seen += 1
            else:
                assert sum(-(-lengths[i] // pad) * pad for i in m) <= cap
    assert (alone_seen > 0) == alone
    # numpy in, numpy out: the same lists.
    arrays = rlsched.plan_step_indices(np.asarray(lengths, dtype=np.int64), ranks, cap,
                                       as_numpy=True, **options)
    assert all(a.dtype == np.int64 for rank in arrays for a in rank)
    assert [[a.tolist() for a in rank] for rank in arrays] == plan


@pytest.mark.parametrize("seed", range(10, 20))
def test_random_plans_place_every_index_once_under_the_cap(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 400)
    ranks = rng.randint(1, 16)
    cap = rng.randint(1000, 70000)
    lengths = [rng.randint(0, cap) for _ in range(n)]
    groups = sorted(rng.randint(0, max(n // 4, 1)) for _ in range(n))
    keep = rng.random() < 0.5
    plan = rlsched.plan_step_indices(lengths, ranks, cap, groups=groups, keep_groups=keep)
    assert len(plan) == ranks
    assert sorted(i for rank in plan for m in rank for i in m) == list(range(n))
    for rank in plan:
        assert len(rank) == len(plan[0])
        for m in rank:
            assert sum(lengths[i] for i in m) <= cap
    if keep:  # a group's samples on one rank
        rank_of = {i: r for r, rank in enumerate(plan) for m in rank for i in m}
        for g in set(groups):
            assert len({rank_of[i] for i in range(n) if groups[i] == g}) == 1


def test_model_config_path_folder_and_mapping_agree(client, tmp_path):
    lengths = _lengths(11, 300, 32768)
    with open(QWEN3_MOE, encoding="utf-8") as f:
        config = json.load(f)
    (tmp_path / "config.json").write_text(json.dumps(config))
    plans = [rlsched.plan_step(lengths, num_ranks=4, max_token_len=32768, model=m)
             for m in (QWEN3_MOE, str(tmp_path), config)]
    plans.append(client.plan_step(lengths, num_ranks=4, max_token_len=32768, model=QWEN3_MOE))
    assert len({(p.predicted_step_time, p.overhead) for p in plans}) == 1
    dense = rlsched.plan_step(lengths, num_ranks=4, max_token_len=32768,
                              model=os.path.join(CONFIGS, "llama-3.1-8b.json"))
    assert dense.overhead != plans[0].overhead
    with pytest.raises(rlsched.InvalidArgumentError, match="model: cannot be combined"):
        rlsched.plan_step(lengths, num_ranks=4, max_token_len=32768, model=config,
                          cost="tokens")
    with pytest.raises(rlsched.InvalidArgumentError, match="config.num_experts_per_tok"):
        rlsched.plan_step(lengths, num_ranks=4, max_token_len=32768,
                          model=dict(config, num_experts_per_tok=0))


def test_model_as_text_mapping_and_bad_files(client, tmp_path):
    np = pytest.importorskip("numpy")
    with open(QWEN3_MOE, encoding="utf-8") as f:
        text = f.read()
    config = json.loads(text)
    lengths = _lengths(13, 100, 32768)
    expected = rlsched.plan_step(lengths, num_ranks=2, max_token_len=32768, model=QWEN3_MOE)
    with_numpy = dict(config, hidden_size=np.int64(config["hidden_size"]))
    for model in (text, with_numpy):
        plan = rlsched.plan_step(lengths, num_ranks=2, max_token_len=32768, model=model)
        assert plan.predicted_step_time == expected.predicted_step_time
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "binary.json").write_bytes(bytes(range(256)) * 4)
    for name, message in (("empty.json", "an empty file"), ("binary.json", "not UTF-8")):
        with pytest.raises(rlsched.InvalidArgumentError, match=message):
            rlsched.plan_step(lengths, num_ranks=2, max_token_len=32768,
                              model=str(tmp_path / name))
    with pytest.raises(rlsched.InvalidArgumentError, match="model: .*NaN|model: Out of range"):
        rlsched.plan_step(lengths, num_ranks=2, max_token_len=32768,
                          model=dict(config, rope_theta=float("nan")))
    # One rank's micro-batches through the daemon take the same options.
    assert client.plan_micro_batches([5, 300, 7], 100, oversize="alone", model=config) == \
        rlsched.plan_micro_batches([5, 300, 7], 100, oversize="alone", model=config)


def test_without_the_baseline_the_same_plan(client):
    lengths = _lengths(12, 500, 32768)
    for call in (client.plan_step, rlsched.plan_step):
        full = call(lengths, num_ranks=8, max_token_len=32768)
        plan_only = call(lengths, num_ranks=8, max_token_len=32768, baseline=False)
        assert plan_only.ranks == full.ranks
        assert full.baseline.predicted_step_time > 0
        assert plan_only.baseline.predicted_step_time == 0


def test_oversize_through_the_daemon_and_in_process(client):
    lengths = [9000, 100, 200, 300, 5000, 40]
    for plan in (client.plan_step(lengths, num_ranks=2, max_token_len=4096, oversize="alone"),
                 rlsched.plan_step(lengths, num_ranks=2, max_token_len=4096, oversize="alone")):
        assert plan.oversized == 2 and plan.tokens == 14640
        sizes = sorted(m.tokens for r in plan.ranks for m in r.micro_batches if m.tokens > 4096)
        assert sizes == [5000, 9000]
    for call in (client.plan_step, rlsched.plan_step):
        with pytest.raises(rlsched.InvalidArgumentError) as info:
            call(lengths, num_ranks=2, max_token_len=4096, oversize="raise")
        assert "lengths[0]" in str(info.value)
        with pytest.raises(rlsched.InvalidArgumentError, match="oversize"):
            call(lengths, num_ranks=2, max_token_len=4096, oversize="drop")


@pytest.mark.parametrize("args,field", [
    (([1, 2], 0, 100), "num_ranks"),
    (([1, 2], 2, 0), "max_token_len"),
    (([1, 200], 2, 100), "lengths[1]"),
    (([1, -2], 2, 100), "lengths[1]"),
])
def test_bad_input_names_the_argument(args, field):
    with pytest.raises(rlsched.InvalidArgumentError) as info:
        rlsched.plan_step_indices(*args)
    assert info.value.field == field, info.value
