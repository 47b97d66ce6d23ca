"""The tiny GRPO run (examples/tiny_grpo/): the model, the task, GRPO learning in one
process, and short live runs (`rlsched run` with real engine and trainer processes)
in sync and async mode.

The live runs check what the workers themselves saw: the trainer's own list of trained
samples against the runtime's counters (each once), the staleness of every trained
token against the bound (from the per-token versions the engines recorded), every
version after the initial policy moved by rlsched's executor over gloo by the runtime's
own weight-sync plans (one run of the plan per version on every rank, in the gloo world
of the plan the runtime sent: its id, epoch, members, group and ranks; no plan made by
the example), and the engines' weights after every sync byte-identical to the
trainer's (SHA-256 of the engine's own HF-named parameters after loading against the
trainer's at publishing). A third live run kills an engine with SIGKILL
mid-generation: every step still runs, every sample is trained once, the runtime plans
the next sync for the survivor (membership epoch 1) and the workers move to that plan's
world, and the reward curve is the one of no kill (and rises). A fourth has an engine
SIGKILL itself during a weight sync, in that sync's gloo world: the runtime replans the
sync for the survivor (SyncWeights.replan), which leaves the broken world at once, loads
the version in the new one and reports it once, the trainer ranks follow, and the run
finishes every step. That the policy learns is checked in one process over more steps
(the live runs are short).
"""

import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_EXAMPLE = os.path.join(_REPO, "examples", "tiny_grpo")
sys.path.insert(0, _EXAMPLE)

# Imported after the importorskip and the example's sys.path entry above (noqa: E402).
import grpo  # noqa: E402
from model import CONFIG_PATH, Config, load_model, weights_digest  # noqa: E402
from task import EOS, DigitTask  # noqa: E402

torch.set_num_threads(1)


def test_parameters_have_the_hf_llama_names_and_shapes():
    c = Config.load()
    model = load_model(seed=0)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    h, i, v, d = c.hidden_size, c.intermediate_size, c.vocab_size, c.head_dim
    expected = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
                "lm_head.weight": (v, h)}
    for n in range(c.num_hidden_layers):
        p = f"model.layers.{n}."
        expected.update({
            p + "self_attn.q_proj.weight": (c.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": (c.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": (c.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": (h, c.num_attention_heads * d),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })
    assert shapes == expected
    assert set(model.state_dict()) == set(expected)  # no buffers beside the parameters
    assert 64 <= h <= 128 and 2 <= c.num_hidden_layers <= 4 and 10 <= v < 100


def test_the_resharding_planner_reads_the_config(rlsched_bin):
    result = subprocess.run(
        [rlsched_bin, "reshard", "--model", CONFIG_PATH, "--train", "tp=2", "--infer",
         "tp=1,replicas=2", "--verify"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "verify: ok" in result.stdout + result.stderr


def test_the_config_is_checked_with_the_field_named(tmp_path):
    with open(CONFIG_PATH) as f:
        data = json.load(f)
    data["num_key_value_heads"] = 3
    with pytest.raises(ValueError, match="num_key_value_heads"):
        Config(data)
    del data["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        Config(data)


def test_kv_cache_decoding_gives_the_full_forwards_logits():
    model = load_model(seed=3)
    model.eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 13, (3, 9), generator=g)
    with torch.no_grad():
        full, _ = model(ids)
        logits, cache = model(ids[:, :4])
        steps = [logits]
        for t in range(4, 9):
            logits, cache = model(ids[:, t:t + 1], cache)
            steps.append(logits)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    # A different prefix changes later logits (the cache is used).
    other = ids.clone()
    other[:, 0] = (other[:, 0] + 1) % 13
    with torch.no_grad():
        changed, _ = model(other)
    assert not torch.allclose(changed[:, -1], full[:, -1])


def test_the_task_and_its_reward():
    task = DigitTask("reverse", digits=3, alphabet=4, seed=5)
    assert task.prompt(7) == task.prompt(7)  # deterministic
    assert DigitTask("reverse", 3, 4, 5).digits_of(7) == task.digits_of(7)
    assert len({tuple(task.digits_of(p)) for p in range(50)}) > 20
    assert all(0 <= d < 4 for p in range(50) for d in task.digits_of(p))
    target = task.target(7)
    assert target == list(reversed(task.prompt(7)[1:-1]))
    assert task.reward(7, target + [EOS]) == 1.0
    wrong = [(t + 1) % 4 for t in target]
    assert task.reward(7, wrong) == 0.0
    assert task.reward(7, [target[0], wrong[1], target[2]]) == pytest.approx(2 / 3)
    assert task.reward(7, [target[0], EOS]) == pytest.approx(1 / 3)  # cut short
    with pytest.raises(ValueError, match="alphabet"):
        DigitTask("reverse", 3, 11)
    with pytest.raises(ValueError, match="operation"):
        DigitTask("sort", 3, 4)
    # add (the default): each digit plus one, modulo the alphabet, in order.
    add = DigitTask(digits=3, alphabet=4, seed=5)
    assert add.operation == "add" and add.prompt(7) == task.prompt(7)
    assert add.target(7) == [(d + 1) % 4 for d in add.prompt(7)[1:-1]]
    assert add.reward(7, add.target(7) + [EOS]) == 1.0
    assert add.reward(7, [(t + 1) % 4 for t in add.target(7)]) == 0.0


def test_group_advantages_are_normalised_within_the_group():
    adv = grpo.group_advantages([1.0, 0.0, 0.5, 0.5])
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    assert adv[0] > adv[2] > adv[1]
    assert torch.tensor(adv).std(unbiased=False).item() == pytest.approx(1.0, rel=1e-4)
    assert grpo.group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]


def test_process_advantages_are_per_position_and_reward_to_go():
    task = DigitTask("reverse", digits=3, alphabet=4, seed=1)
    target = task.target(0)
    wrong = [(t + 1) % 4 for t in target]
    responses = [target + [EOS], [target[0], wrong[1], target[2], EOS],
                 [target[0], EOS], [target[0], target[1], wrong[2], EOS]]
    rewards = [task.position_rewards(0, r) for r in responses]
    assert [sum(r) for r in rewards] == pytest.approx([task.reward(0, r) for r in responses])
    assert rewards[2] == [pytest.approx(1 / 3), 0.0, 0.0]  # cut short: the rest wrong
    adv = grpo.process_advantages(rewards, [len(r) for r in responses])
    assert [len(a) for a in adv] == [4, 4, 2, 4]
    # Position 0: every sample right, so it adds nothing; each position's term has
    # zero mean within the group; a token's advantage is the sum of its position's
    # term and the later ones' (EOS, past the scored positions: 0).
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        table = (torch.rand(6, 3, generator=g) < 0.5).double() / 3
        table[:, 0] = 1 / 3
        a = torch.tensor(grpo.process_advantages(table.tolist(), [4] * 6), dtype=torch.float64)
        assert a[:, 3].abs().max() == 0
        own = a[:, :3] - torch.cat((a[:, 1:3], torch.zeros(6, 1, dtype=torch.float64)), 1)
        assert own.sum(0).abs().max() < 1e-9  # zero mean per position
        assert own[:, 0].abs().max() < 1e-9  # a constant position adds 0
        for k in (1, 2):
            col = table[:, k]
            want = (col - col.mean()) / (col.std(unbiased=False) + 1e-6)
            assert torch.allclose(own[:, k], want, atol=1e-9)
        assert torch.allclose(a[:, 0], a[:, 1])  # position 0 adds 0: to-go equals pos 1's
    with pytest.raises(ValueError, match="advantage"):
        grpo.advantages("pooled", [0.0], [[0.0]], [1])


def _batch(task, model, n=12, seed=0):
    rollouts = [grpo.Rollout(s, s // 4, s // 4, task.prompt(s // 4), task.max_new_tokens,
                             grpo.sample_seed(seed, s)) for s in range(n)]
    while any(not r.done for r in rollouts):
        grpo.decode_step(model, rollouts, 0)
    batch = []
    for g in range(n // 4):
        rows = rollouts[4 * g:4 * g + 4]
        for r, a in zip(rows, grpo.group_advantages(
                [task.reward(r.prompt_id, r.response) for r in rows])):
            batch.append({"prompt": r.prompt, "response": r.response, "logprobs": r.logprobs,
                          "advantage": a})
    return rollouts, batch


def test_engine_logprobs_are_the_models_and_micro_batches_do_not_change_the_gradient():
    task = DigitTask("reverse", 3, 4, 0)
    model = load_model(seed=1)
    rollouts, batch = _batch(task, model)
    # Generation in mixed batches (decode_step) gives the logprobs of a full forward.
    with torch.no_grad():
        for r in rollouts:
            logits, _ = model(torch.tensor([r.prompt + r.response]))
            logp = torch.log_softmax(logits[0], -1)
            start = len(r.prompt) - 1
            want = [float(logp[start + k, t]) for k, t in enumerate(r.response)]
            assert r.logprobs == pytest.approx(want, abs=1e-5)
    # On-policy (ratio 1) the loss is -Σ A over tokens; one batch and three micro-batches
    # normalised by the call's tokens give the same gradient.
    tokens = sum(len(b["response"]) for b in batch)
    model.zero_grad()
    loss, n = grpo.policy_loss(model, batch)
    assert n == tokens
    assert float(loss) == pytest.approx(
        -sum(b["advantage"] * len(b["response"]) for b in batch), abs=1e-4)
    (loss / tokens).backward()
    whole = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    for part in (batch[:5], batch[5:6], batch[6:]):
        part_loss, _ = grpo.policy_loss(model, part)
        (part_loss / tokens).backward()
    for k, p in model.named_parameters():
        assert torch.allclose(p.grad, whole[k], atol=1e-6), k


@pytest.mark.parametrize("dp", [1, 2])
def test_tensor_parallel_model_matches_the_tp1_model_in_a_gloo_world(tmp_path, dp):
    """tensor_parallel.py --check: the TP-2 model (column-parallel q/k/v and gate/up,
    row-parallel o and down, heads 2 + 1 KV per rank; embedding, lm_head and norms
    replicated) in a real world of 2 processes over gloo, from the TP-1 model's initial
    state, against the TP-1 model on a fixed GRPO batch in two micro-batches. Gathered
    initial weights: byte-identical. Forward logits (whole sequences and one KV-cached
    step), log-softmax, the summed loss, the gathered gradients and the clipped norm:
    within 1e-5 absolute (row-parallel sums add the two ranks' partial products in
    another order than one matmul: measured 1e-7 to 5e-7); after 3 Adam steps (lr
    1e-2, norm clipped at 0.5; weights move up to 3e-2) within 5e-4 (measured 6e-5:
    Adam divides by sqrt(v), which scales the reduction-order differences of the
    smallest gradients). The replicated parameters hold the same bits on both ranks
    after training (every all-reduce adds in rank order). With DP 2 (4 processes), each
    replica trains one of the two micro-batches and the replicas add up their gradients:
    the same bounds, and every parameter the same bits on both replicas."""
    out = tmp_path / "check.json"
    result = subprocess.run([sys.executable, os.path.join(_EXAMPLE, "tensor_parallel.py"),
                             "--check", "--tp", "2", "--dp", str(dp), "--steps", "3",
                             "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(out) as f:
        check = json.load(f)
    diff = check["max_abs_diff"]
    assert (check["tp"], check["dp"]) == (2, dp)
    assert check["initial_identical"] and diff["initial"] == 0.0, check
    assert check["replicated_identical"], check
    for kind in ("logits", "cached_logits", "logprobs", "loss", "grads", "norm0", "norm1",
                 "norm2"):
        assert diff[kind] <= 1e-5, (kind, check)
    assert diff["trained"] <= 5e-4, check
    # Not trivially equal: the quantities are of order 1e-1..1, and training moved the
    # weights.
    assert check["max_abs_value"]["grads"] > 1e-2 and check["max_abs_value"]["logits"] > 1e-1


def test_tensor_parallel_refuses_sizes_the_model_cannot_be_split_by(rlsched_bin, tmp_path):
    from tensor_parallel import TPGroup, check_tp, split_dim
    c = Config.load()
    check_tp(c, 2)
    with pytest.raises(ValueError, match="num_key_value_heads \\(2\\) must be a multiple of "
                       "the trainer's TP size 4"):
        check_tp(c, 4)
    with pytest.raises(ValueError, match="tp must be an integer >= 1"):
        check_tp(c, 0)
    with pytest.raises(ValueError, match="tp rank must be in \\[0, 2\\)"):
        TPGroup(2, 2)
    assert split_dim("model.layers.1.self_attn.k_proj.weight") == 0
    assert split_dim("model.layers.0.mlp.down_proj.weight") == 1
    assert split_dim("lm_head.weight") is None and split_dim("model.norm.weight") is None
    # run.py refuses them before it starts anything, and a DP size above the step plan's
    # ranks.
    for option, message in ((["--trainer-tp", "4"], "num_key_value_heads \\(2\\) must be a "
                             "multiple of the trainer's TP size 4"),
                            (["--trainer-dp", "3"], "--trainer-dp must be in \\[1, "
                             "--trainer-ranks 2\\]")):
        result = subprocess.run([sys.executable, os.path.join(_EXAMPLE, "run.py"),
                                 "--rlsched-bin", rlsched_bin, "--out", str(tmp_path / "x"),
                                 *option], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, result.stderr
        assert re.search(message, result.stderr), result.stderr


def test_weights_published_as_files_load_byte_identical(tmp_path):
    from workers import load_weights, publish_weights
    os.makedirs(tmp_path / "weights")
    trained = load_model(seed=4)
    digest = publish_weights(str(tmp_path), 3, trained)
    assert digest == weights_digest(trained.state_dict())
    engine = load_model(seed=5)
    assert weights_digest(engine.state_dict()) != digest
    load_weights(str(tmp_path), 3, engine)
    assert weights_digest(engine.state_dict()) == digest
    with pytest.raises(RuntimeError, match="version 4 not published"):
        load_weights(str(tmp_path), 4, engine, timeout=0.05)


def test_grpo_learns_the_task_in_one_process():
    """Fixed seed: from near chance (the untrained policy spreads over 16 tokens:
    ~0.06; digits only would be 0.25) the mean reward rises clearly in 20 steps of
    8 prompts x 8 samples."""
    task = DigitTask(digits=3, alphabet=4, seed=0)
    model = load_model(seed=0)
    curve = grpo.train_in_process(task, model, steps=20, prompts_per_step=8,
                                  samples_per_prompt=8, seed=0, lr=1e-3, epochs=4,
                                  max_grad_norm=1.0, advantage="process")
    first = sum(curve[:3]) / 3
    last = sum(curve[-5:]) / 5
    assert first < 0.15, curve
    assert last > 0.35 and last > first + 0.2, curve


def _live(rlsched_bin, out, *args):
    result = subprocess.run(
        [sys.executable, os.path.join(_EXAMPLE, "run.py"), "--rlsched-bin", rlsched_bin,
         "--out", str(out), "--engines", "2", "--timeout", "240", *args],
        capture_output=True, text=True, timeout=400)
    logs = ""
    for name in ("rlsched", "trainer", "trainer1", "trainer2", "trainer3", "engine0",
                 "engine1"):
        path = os.path.join(out, f"{name}.log")
        if os.path.exists(path):
            with open(path) as f:
                logs += f"--- {name}\n" + f.read()[-2000:]
    assert result.returncode == 0, result.stdout + result.stderr + logs
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    reports = {}
    for name in ("trainer", "trainer1", "trainer2", "trainer3", "engine0", "engine1"):
        path = os.path.join(out, f"{name}.json")
        if os.path.exists(path):  # a killed engine wrote none
            with open(path) as f:
                reports[name] = json.load(f)
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    return summary, reports, report


def test_weight_sync_plans_the_run_cannot_run_are_refused_naming_the_field(tmp_path):
    """A worker checks each WeightSyncPlan the runtime sends before it builds a world:
    the backend, the ranks (engines TP 1, the trainer its TP size), the world size (the
    summary's trainer ranks and the members), the worker's replica and rank."""
    from rlsched.v1 import reshard_pb2, runtime_pb2
    from rlsched.worker.weights import WeightUpdate
    from workers import PlanSync

    def plan(**fields):
        group = runtime_pb2.TransferGroup(name="rlsched-weights-0-ab", backend=fields.pop(
            "backend", "gloo"), world_size=fields.pop("world_size", 3))
        summary = reshard_pb2.ReshardPlan(trainer_ranks=fields.pop("trainer_ranks", 1))
        base = dict(plan_id="0-ab", epoch=0, group=group, members=[0, 1], replica=1,
                    rank_offset=2, ranks=0, summary=summary)
        base.update(fields)
        base["parts"] = [reshard_pb2.ReshardRankPart() for _ in range(base["ranks"])]
        return WeightUpdate(runtime_pb2.WeightSyncPlan(**base))

    engine, trainer = PlanSync(str(tmp_path), engine=1), PlanSync(str(tmp_path))
    trainer2 = PlanSync(str(tmp_path), tp=2, trainer_rank=1)
    for sync, part, field in [
            (engine, plan(backend="nccl"), "group.backend"),
            (engine, plan(), "ranks: 0"),
            (engine, plan(world_size=4), "group.world_size: 4"),
            (engine, plan(replica=0, rank_offset=1), "replica: 0, engine 1 is not"),
            (engine, plan(members=[1, 3], replica=0, rank_offset=2), "rank_offset: 2"),
            # Trainer TP 2: the engines come after both trainer ranks.
            (engine, plan(world_size=4, trainer_ranks=2, ranks=1), "rank_offset: 2, "
             "replica 1's is 3 \\(after 2 trainer ranks\\)"),
            (engine, plan(trainer_ranks=0, world_size=2, ranks=1), "summary.trainer_ranks: 0"),
            (trainer, plan(), "replica/rank_offset: 1/2"),
            (trainer, plan(replica=-1, rank_offset=0, ranks=1, world_size=4, trainer_ranks=2),
             "ranks: 1 \\(summary.trainer_ranks 2, train tp=1 dp=1\\), the trainer is "
             "TP 1 x DP 1"),
            (trainer2, plan(replica=-1, rank_offset=0, ranks=1), "the trainer is TP 2")]:
        with pytest.raises(RuntimeError, match=field):
            sync.check(part)
    with pytest.raises(RuntimeError, match="names no weight-sync plan"):
        engine.receive(None, 1)
    assert engine.plan is None and trainer.newest is None  # nothing joined or kept


def _runtime_plans(out):
    """The weight-sync plans `rlsched run` made, from its log (run.py runs it with
    --log-level info): [(plan id, members)] in the order made."""
    plans = []
    with open(os.path.join(out, "rlsched.log")) as f:
        for line in f:
            if "weight-sync plan " in line and ": engines [" in line:
                plan_id = line.split("weight-sync plan ")[1].split(":")[0]
                members = line.split(": engines [")[1].split("]")[0]
                plans.append((plan_id, [int(x) for x in members.replace(",", " ").split()]))
    return plans


def _check_worlds(out, reports, names, expected_members, trainer_ranks=1):
    """Every worker in `names` moved the weights in the worlds of the runtime's plans,
    one per plan in the order the runtime made them, with the members given: the plan
    id, its epoch (the id's prefix, counted from 0), members, transfer group and the
    worker's rank as the runtime sent them (trainer rank r: r; engine members[k]:
    trainer_ranks + k); no plan file of the example's own (with more than one trainer
    rank, rank 0's record of the worlds it joined, for the other ranks, holds the
    runtime's plans in order)."""
    plans = _runtime_plans(out)
    assert [members for _, members in plans] == expected_members, plans
    assert [int(plan_id.split("-")[0]) for plan_id, _ in plans] == list(range(len(plans)))
    for name in names:
        worlds = reports[name]["weight_sync"]["epochs"]
        assert [(w["plan_id"], w["members"]) for w in worlds] == plans, (name, worlds)
        for w, (plan_id, members) in zip(worlds, plans):
            assert w["epoch"] == int(plan_id.split("-")[0]), (name, w)
            assert w["group"] == "rlsched-weights-" + plan_id, (name, w)
            assert w["world_size"] == trainer_ranks + len(members), (name, w)
            rank = (int(name[len("trainer"):] or 0) if name.startswith("trainer")
                    else trainer_ranks + members.index(int(name[len("engine"):])))
            assert w["rank"] == rank, (name, w)
        assert sum(w["runs"] for w in worlds) == reports[name]["weight_sync"]["runs"]
        assert worlds[-1]["runs"] >= 1, (name, worlds)
        if name.startswith("engine"):
            # Each SyncWeights named the plan of the world the engine received it in
            # (then those of its replans, when its world lost a member): the worlds'
            # plans in order, each named by a run of its syncs.
            named = [p for s in reports[name]["syncs"]
                     for p in [s["plan_id"]] + [r["plan_id"] for r in s["replans"]]]
            assert [p for i, p in enumerate(named) if i == 0 or named[i - 1] != p] == [
                w["plan_id"] for w in worlds], (name, named)
    data = os.path.join(out, "data")
    assert not [n for n in os.listdir(data) if n.startswith("plan") or n == "epochs"]
    from rlsched.v1 import runtime_pb2
    recorded = []
    for k in range(len(os.listdir(os.path.join(data, "trainer_worlds")))):
        with open(os.path.join(data, "trainer_worlds", f"{k}.binpb"), "rb") as f:
            recorded.append(runtime_pb2.WeightSyncPlan.FromString(f.read()).plan_id)
    assert recorded == ([plan_id for plan_id, _ in plans] if trainer_ranks > 1 else []), recorded
    # The rendezvous files are named after the runtime's groups (gloo may remove one
    # when every rank left it).
    assert set(os.listdir(os.path.join(data, "stores"))) <= {
        "rlsched-weights-" + plan_id for plan_id, _ in plans}


def _check_live(out, summary, reports, report, steps, max_staleness, trainer_tp=1,
                trainer_dp=1):
    prompts, group = 8, 8
    assert summary["ok"], summary["checks"]
    assert report["done"]
    assert int(report.get("rejected_events", 0)) == 0  # every worker report was valid
    counters = report["counters"]
    # Every sample trained once, as the trainer counted, and each one finished by an engine.
    trained = reports["trainer"]["trained"]
    assert len(trained) == len(set(trained)) == int(counters["trained"]) == steps * prompts * group
    finished = set(reports["engine0"]["finished"]) | set(reports["engine1"]["finished"])
    assert set(trained) <= finished
    assert reports["engine0"]["finished"] and reports["engine1"]["finished"]  # both worked
    # The staleness bound on every trained token, from the engines' per-token versions.
    assert reports["trainer"]["staleness_violations"] == 0
    assert reports["trainer"]["max_staleness"] == max_staleness
    assert summary["max_token_staleness"] <= max_staleness
    assert int(report["metrics"].get("max_staleness", 0)) <= max_staleness
    # Weights: every version loaded equals the trainer's, and each engine ended with the
    # last one.
    published = reports["trainer"]["published"]
    assert sorted(int(v) for v in published) == list(range(steps + 1))
    assert len(set(published.values())) == steps + 1  # every step changed the weights
    for name in ("engine0", "engine1"):
        loaded = reports[name]["loaded"]
        assert loaded, name
        for version, digest in loaded.items():
            assert digest == published[version], (name, version)
        assert str(steps) in loaded, (name, sorted(loaded))
    # Every version after the initial policy (version 0, which every rank loads from
    # its file) went through rlsched's executor (gloo) to every engine: one run of the
    # plan per version on every rank, each engine receiving the model's bytes (fp32 HF
    # parameters; the vocabulary's padding rows are not sent) per run; by the one plan
    # the runtime made for both engines, in its world.
    model_bytes = sum(p.numel() * p.element_size() for p in load_model().parameters())
    ranks = trainer_tp * trainer_dp
    trainers = ["trainer"] + [f"trainer{r}" for r in range(1, ranks)]
    for name in trainers + ["engine0", "engine1"]:
        sync = reports[name]["weight_sync"]
        assert sync["runs"] == steps, (name, sync)
        if name.startswith("engine"):
            assert sync["bytes"] == steps * model_bytes, (name, sync)
    # The trainer's ranks sent the model once per run between them (each to both
    # engines in one broadcast); with TP > 1 the DP replicas of each TP rank sent at
    # least the slices of the split projections that only that TP rank holds.
    assert sum(reports[n]["weight_sync"]["bytes"] for n in trainers) == steps * model_bytes
    if trainer_tp > 1:
        from tensor_parallel import split_dim
        split_bytes = sum(p.numel() * p.element_size() for n, p in
                          load_model().named_parameters() if split_dim(n) is not None)
        for t in range(trainer_tp):
            sent = sum(reports[trainers[d * trainer_tp + t]]["weight_sync"]["bytes"]
                       for d in range(trainer_dp))
            assert sent >= steps * split_bytes // trainer_tp, (t, sent)
    if ranks > 1:
        # Every trainer rank trained every call with rank 0 and reported to it; each DP
        # replica trained its step plan ranks' samples, together every sample once.
        assert [(r["rank"], r["tp_rank"], r["dp_rank"]) for r in reports["trainer"]["ranks"]] == [
            (g, g % trainer_tp, g // trainer_tp) for g in range(ranks)]
        assert (reports["trainer"]["tp"], reports["trainer"]["dp"]) == (trainer_tp, trainer_dp)
        assert (summary["trainer_tp"], summary["trainer_dp"]) == (trainer_tp, trainer_dp)
        calls = reports["trainer"]["steps"]
        for name in trainers[1:]:
            assert [(s["step"], s["samples"]) for s in reports[name]["steps"]] == [
                (s["step"], s["samples"]) for s in calls], name
            assert reports[name]["sync_error"] is None
        for i, call in enumerate(calls):
            for t in range(trainer_tp):
                per_replica = [
                    (calls if d * trainer_tp + t == 0 else
                     reports[trainers[d * trainer_tp + t]]["steps"])[i]["trained"]
                    for d in range(trainer_dp)]
                assert sum(per_replica) == call["samples"], (i, t, per_replica)
                if trainer_dp > 1:
                    assert min(per_replica) > 0, (i, t, per_replica)  # each replica worked
        assert summary["checks"]["trainer_ranks_followed"]
    _check_worlds(out, reports, trainers + ["engine0", "engine1"], [[0, 1]], ranks)
    for name in ("engine0", "engine1"):  # one SyncWeights per version after 0, in order
        assert [s["version"] for s in reports[name]["syncs"]] == list(range(1, steps + 1))
    assert summary["checks"]["weight_sync_by_runtime_plans"]
    # The CSV has a row per step.
    with open(os.path.join(out, "rewards.csv")) as f:
        rows = f.read().strip().splitlines()
    assert len(rows) == steps + 1 and rows[0].startswith("step,mean_reward")


# A TP-2 trainer's reward curve against one-process GRPO's (TP 1) cannot be equal by
# construction: the weights differ in their last bits (the row-parallel linears add
# the ranks' partial sums in another order than one matmul; tensor_parallel.py --check
# measures 6e-5 after 3 Adam steps), so a sampled token differs where an engine's draw
# falls within such a difference of a boundary of the cumulative distribution, and
# that sample's later tokens with it: its reward moves by at most 1, the step's mean
# (64 samples) by at most 1/64. Measured: equal at every step of 3-, 5- and 30-step sync
# runs; over 60 steps the first difference came at step 33 (one position of one sample,
# 1/192), after which the two runs' curves part (the last 5 steps' means 0.808 at TP 1,
# 0.764 at TP 2). The tolerance allows two samples changed in these 3- and 5-step runs.
TP2_REWARD_TOLERANCE = 2 / 64 + 1e-9


def _reference(steps):
    """GRPO in one process, TP 1 (run.py's defaults: lr 1e-3, 4 passes, the gradient's
    norm clipped at 1, per-token process advantages)."""
    return grpo.train_in_process(DigitTask("add", 3, 4, 0), load_model(seed=0), steps=steps,
                                 prompts_per_step=8, samples_per_prompt=8, seed=0, lr=1e-3,
                                 epochs=4, max_grad_norm=1.0, advantage="process")


def test_a_late_engine_is_in_the_first_weight_sync(rlsched_bin, tmp_path):
    """Engine 0 starts 1.5 s after the others: the first prompts wait for it (rlsched run
    --wait-for-engines), so the first weight sync's world holds both engines and every
    version moves once (without the wait the first sync had engine 1 alone, the late
    engine's join made a new world mid-run, and a version was sent again: 4 runs for 3
    versions)."""
    out = tmp_path / "late"
    summary, reports, report = _live(rlsched_bin, out, "--mode", "sync", "--steps", "3",
                                     "--late-engine-seconds", "1.5")
    assert summary["ok"], summary["checks"]
    sync = reports["trainer"]["weight_sync"]
    assert [(e["members"], e["runs"], e["failed"]) for e in sync["epochs"]] == [
        ([0, 1], 3, None)], sync
    assert sync["runs"] == 3
    assert [[int(m) for m in e["members"]] for e in report["weight_sync"]] == [[0, 1]]


def test_live_sync_runs_with_trainer_tp_and_dp(rlsched_bin, tmp_path):
    """Sync mode with the trainer in TP 1, TP 2, and TP 2 x DP 2 (4 trainer processes,
    rlsched run --train tp=2,dp=2)."""
    reference = _reference(3)
    for tp, dp in ((1, 1), (2, 1), (2, 2)):
        out = tmp_path / f"sync_tp{tp}_dp{dp}"
        summary, reports, report = _live(rlsched_bin, out, "--mode", "sync", "--steps", "3",
                                         "--trainer-tp", str(tp), "--trainer-dp", str(dp))
        _check_live(out, summary, reports, report, steps=3, max_staleness=0, trainer_tp=tp,
                    trainer_dp=dp)
        assert summary["max_token_staleness"] == 0
        live = [s["mean_reward"] for s in reports["trainer"]["steps"]]
        if tp == 1:
            # Sync mode trains what GRPO in one process trains (the same prompts, the
            # same sampling seeds per sample): the same mean reward at every step,
            # although the live run generated on two engines in batches of its own and
            # trained in the step plan's micro-batches.
            assert live == pytest.approx(reference, abs=1e-12)
        else:
            # TP 2 (and DP 2): the same within TP2_REWARD_TOLERANCE (the weights differ
            # in their last bits); the engines' weights after each sync are the
            # trainer's gathered weights, byte for byte (_check_live).
            assert live == pytest.approx(reference, abs=TP2_REWARD_TOLERANCE)


def test_live_async_run(rlsched_bin, tmp_path):
    """Async with staleness 1 and partial rollout, the trainer in TP 2."""
    # Engines paced (a decode step at least 0.1 s, 8 samples at once) so that a batch
    # generates longer than a step trains: the weight syncs find samples in flight.
    async_out = tmp_path / "async"
    summary, reports, report = _live(rlsched_bin, async_out, "--mode", "async",
                                     "--max-staleness", "1", "--partial-rollout",
                                     "--steps", "4", "--max-concurrent", "8",
                                     "--engine-min-step-seconds", "0.1", "--trainer-tp", "2")
    _check_live(async_out, summary, reports, report, steps=4, max_staleness=1, trainer_tp=2)
    # Generation overlapped training: some trained tokens are one version old.
    assert summary["max_token_staleness"] == 1
    # Partial rollout: the weight syncs interrupted the engines, and some trained
    # samples carry tokens of two versions (as the engines recorded them per token);
    # the runtime counted each of those as partial.
    assert sum(r["interrupts"] for n, r in reports.items() if n.startswith("engine")) >= 1
    assert reports["trainer"]["partial_samples"] >= 1
    assert reports["trainer"]["partial_samples"] == int(report["counters"]["partial_samples"])


# At the default trainer TP 2 only (TP 1 runs the same recovery with one trainer rank;
# the sync run at TP 1 checks that the example trains what GRPO in one process does).
@pytest.mark.parametrize("tp", [2])
def test_live_run_survives_an_engine_killed_mid_generation(rlsched_bin, tmp_path, tp):
    """Engine 1 is killed with SIGKILL in the middle of a decode under version 2 (its
    samples half generated). The runtime requeues its samples on engine 0 and plans the
    next weight sync without it (membership epoch 1: the trainer and engine 0, a new
    plan id and transfer group); the trainer (each of its TP ranks) and engine 0 leave
    the gloo world the dead engine was a member of for that plan's; the run finishes
    every step."""
    steps, prompts, group = 5, 8, 8
    out = tmp_path / "kill"
    summary, reports, report = _live(rlsched_bin, out, "--mode", "sync", "--steps", str(steps),
                                     "--kill-engine-at", "2", "--trainer-tp", str(tp))
    trainers = ["trainer"] + [f"trainer{r}" for r in range(1, tp)]
    assert "engine1" not in reports  # killed: it wrote no report
    assert summary["ok"], summary["checks"]
    assert summary["checks"]["engine_killed_mid_generation"]
    killed = summary["killed"]
    assert killed["engine"] == "engine1" and killed["version"] == 2 and killed["running"] > 0
    counters = report["counters"]
    assert int(counters["engine_failures"]) == 1
    assert int(counters["restarts"]) >= 1  # samples it held were generated again
    # No sample lost or trained twice, by the workers' own counts: the trainer trained
    # every sample of every step once; each was finished by an engine (their logs of
    # finished samples, which the SIGKILL left), both engines' among them.
    trained = reports["trainer"]["trained"]
    assert len(trained) == len(set(trained)) == steps * prompts * group == int(counters["trained"])
    by_engine = reports["trainer"]["trained_by_engine"]
    assert set(by_engine) == {"0", "1"} and sum(by_engine.values()) == len(trained)
    data = os.path.join(out, "data")
    finished = set()
    for e in (0, 1):
        with open(os.path.join(data, f"finished.engine{e}")) as f:
            finished |= {int(x) for x in f.read().split()}
    assert set(trained) <= finished
    # The weight-sync world was rebuilt once, without the dead engine, on both sides:
    # the runtime planned the survivor's sync (membership epoch 1) and both trainer TP
    # ranks and engine 0 moved to that plan's world; versions 3.. went by it.
    for name in trainers + ["engine0"]:
        epochs = reports[name]["weight_sync"]["epochs"]
        assert [e["members"] for e in epochs] == [[0, 1], [0]], (name, epochs)
        assert [e["runs"] for e in epochs] == [2, steps - 2], (name, epochs)
        assert epochs[1]["resend_from"] == 3, (name, epochs)
    _check_worlds(out, reports, trainers + ["engine0"], [[0, 1], [0]], trainer_ranks=tp)
    # The survivor loaded every version, byte-identical to the trainer's.
    published = reports["trainer"]["published"]
    loaded = reports["engine0"]["loaded"]
    assert sorted(int(v) for v in loaded) == list(range(steps + 1))
    for version, digest in loaded.items():
        assert digest == published[version], version
    # Sync mode: the samples engine 1 lost were generated again with the same sampling
    # seeds, so the run trains what GRPO in one process trains: the same mean reward
    # at every step as with no engine killed (TP 2: within TP2_REWARD_TOLERANCE).
    live = [s["mean_reward"] for s in reports["trainer"]["steps"]]
    assert live == pytest.approx(_reference(steps),
                                 abs=1e-12 if tp == 1 else TP2_REWARD_TOLERANCE)
    assert live[-1] > live[0] + 0.03, live  # and the reward went up through the kill


@pytest.mark.parametrize("version", [1, 2])
def test_live_run_survives_an_engine_lost_during_a_weight_sync(rlsched_bin, tmp_path, version):
    """Engine 1 SIGKILLs itself during the weight sync of `version`, in that sync's gloo
    world, sync mode at the default trainer TP 2: version 1 once it joined the world
    (the first sync's), before the executor's collective checks; version 2 (a world
    joined before) just before the run that carries it. Either way the others cannot
    finish the sync without it (a run ends for all the world's members or none), so
    the runtime sees the loss during the sync. It sends engine 0 a replan (the same
    version by the plan of the membership without engine 1, epoch 1); engine 0's sync
    thread leaves the broken world as soon as it fails there, joins the new one and
    loads the version by it, reporting it once; both trainer ranks, whose join or run
    failed in the old world, move to the new one, which sends from that version. Every
    step runs, every sample is trained once, and engine 0's weights are the trainer's
    after every sync."""
    steps, prompts, group = 3, 8, 8
    out = tmp_path / "die"
    summary, reports, report = _live(rlsched_bin, out, "--mode", "sync", "--steps", str(steps),
                                     "--kill-engine-during-sync", str(version))
    trainers = ["trainer", "trainer1"]  # the default TP 2
    assert "engine1" not in reports  # killed: it wrote no report
    assert summary["ok"], summary["checks"]
    assert summary["checks"]["engine_killed_during_sync"]
    killed = summary["killed"]
    assert (killed["engine"], killed["version"], killed["members"]) == ("engine1", version,
                                                                        [0, 1])
    assert killed["where"].startswith("joined its world" if version == 1 else
                                      "before the run that carries it")
    assert int(report.get("rejected_events", 0)) == 0  # no second WeightsLoaded, say
    counters = report["counters"]
    assert int(counters["engine_failures"]) == 1
    # The runtime replanned the sync under way for the survivor, by the membership
    # without the lost engine (epoch 1): one replan, and its plan then carried every
    # later version (the replan of `version` and the syncs after it); the first plan
    # the syncs of both engines before.
    assert int(report["weight_sync_replans"]) == 1
    epochs = [(int(e["epoch"]), [int(m) for m in e["members"]], int(e["syncs"]))
              for e in report["weight_sync"]]
    assert epochs == [(0, [0, 1], 2 * version), (1, [0], steps - version + 1)], epochs
    # No sample lost or trained twice, by the workers' own counts: the trainer's list
    # against the engines' logs of what they finished (the victim's survives it).
    trained = reports["trainer"]["trained"]
    assert len(trained) == len(set(trained)) == steps * prompts * group == int(counters["trained"])
    finished = set()
    for e in (0, 1):
        with open(os.path.join(out, "data", f"finished.engine{e}")) as f:
            finished |= {int(x) for x in f.read().split()}
    assert set(trained) <= finished
    by_engine = reports["trainer"]["trained_by_engine"]
    assert set(by_engine) <= {"0", "1"} and sum(by_engine.values()) == len(trained)
    # The survivor: `version` failed in the old world (at once, not at the 120 s
    # timeout), came by the replan's plan, and was reported once; every version once,
    # in order, each byte-identical to the trainer's.
    survivor = reports["engine0"]
    assert [s["version"] for s in survivor["syncs"]] == list(range(1, steps + 1))
    lost = survivor["syncs"][version - 1]
    plans = _runtime_plans(out)
    assert [members for _, members in plans] == [[0, 1], [0]], plans
    (old, _), (new, _) = plans
    assert lost["plan_id"] == old
    assert [(r["plan_id"], r["lost"]) for r in lost["replans"]] == [(new, old)], lost
    assert lost["replans"][0]["failed_after_seconds"] < 60, lost
    assert all(not s["replans"] for s in survivor["syncs"] if s is not lost)
    assert survivor["quiet_replans"] == [] and survivor["error"] is None
    published = reports["trainer"]["published"]
    assert sorted(int(v) for v in survivor["loaded"]) == list(range(steps + 1))
    for v, digest in survivor["loaded"].items():
        assert digest == published[v], v
    # Worlds: every trainer rank and the survivor ran the versions before `version` in
    # the old plan's world (none for version 1: lost while it was built), failed there,
    # and ran the others in the new one, sent from `version` (what the survivor lacked).
    for name in trainers + ["engine0"]:
        worlds = reports[name]["weight_sync"]["epochs"]
        assert [(w["plan_id"], w["runs"], w["failed"] is not None) for w in worlds] == [
            (old, version - 1, True), (new, steps - version + 1, False)], (name, worlds)
        assert worlds[1]["resend_from"] == version, (name, worlds)
        assert reports[name]["weight_sync"]["runs"] == steps
    for name in trainers[1:]:
        assert reports[name]["sync_error"] is None
    assert reports["trainer"]["sync_error"] is None
    _check_worlds(out, reports, trainers + ["engine0"], [[0, 1], [0]], trainer_ranks=2)
    # Sync mode: the run trains what GRPO in one process trains (TP 2: within
    # TP2_REWARD_TOLERANCE): the lost engine took no sample with it.
    live = [s["mean_reward"] for s in reports["trainer"]["steps"]]
    assert live == pytest.approx(_reference(steps), abs=TP2_REWARD_TOLERANCE)


class _Plan:
    def __init__(self, plan_id):
        self.plan_id = plan_id


class _Sync:
    """A SyncWeights as the engine reads it (the message's fields and its plan)."""

    def __init__(self, version, plan_id, replan=False):
        self.version, self.plan, self.plan_id = version, _Plan(plan_id), plan_id
        self.replan, self.interrupt = replan, False

    def __repr__(self):
        return f"_Sync({self.version}, {self.plan_id!r}, replan={self.replan})"


class _Worlds:
    """PlanSync's engine side as TinyEngine's sync thread uses it: the worlds of the
    plans in `lost` fail under the engine (WorldLost, after which `on_lost` may queue
    the runtime's replan), the others deliver the version asked for."""

    def __init__(self, lost=(), on_lost=None, timeout=5.0):
        import datetime
        self.lost, self.on_lost = set(lost), on_lost
        self.timeout = datetime.timedelta(seconds=timeout)
        self.received, self.calls = 0, []
        self.state = load_model(seed=1).state_dict()

    def receive(self, plan, version):
        from workers import WorldLost
        self.calls.append(("receive", plan.plan_id, version))
        if plan.plan_id in self.lost:
            if self.on_lost:
                self.on_lost(plan, version)
            raise WorldLost(plan, "Connection closed by peer")
        self.received = version
        return self.state

    def enter(self, plan, version=-1):
        self.calls.append(("enter", plan.plan_id))

    def report(self):
        return {}


def _engine_with(tmp_path, worlds):
    """A TinyEngine (never attached) whose reports are kept, with `worlds` for its
    executor side."""
    from workers import TinyEngine, publish_weights
    data = str(tmp_path)
    for sub in ("samples", "partial", "weights"):
        os.makedirs(os.path.join(data, sub), exist_ok=True)
    publish_weights(data, 0, load_model(seed=0))
    engine = TinyEngine("unix:/nonexistent", 0, 8, data=data, task=DigitTask("add", 3, 4, 0),
                        weight_sync=worlds)
    events = []
    engine.send_event = lambda **kind: events.append(kind)
    fatal = []
    engine.on_fatal = lambda: fatal.append(engine.error)
    return engine, events, fatal


def _run_syncs(engine, events, *syncs):
    """Runs the engine's sync thread on `syncs`, each given once the sync before it was
    reported (as the runtime sends them; a replan at once)."""
    import threading
    import time as _time
    thread = threading.Thread(target=engine._sync_loop)
    thread.start()
    for sync in syncs:
        expected = len(events) + (0 if sync.replan else 1)
        engine._syncs.put((sync, _time.monotonic()))
        deadline = _time.monotonic() + 30
        while len(events) < expected and thread.is_alive() and _time.monotonic() < deadline:
            _time.sleep(0.005)
    engine._syncs.put(None)
    thread.join(30)
    assert not thread.is_alive()


def test_engine_sync_thread_follows_replans(tmp_path):
    """The engine's side of SyncWeights.replan, without processes: a world lost under
    the sync of version 1 (the runtime's replan arriving as it fails) is left and the
    version loaded by the replan's plan, reported once; a replan already queued when a
    sync starts replaces its plan (the lost world is never tried); a replan of a
    version held moves the engine to the new world with no report; a world lost with
    no replan in time, or a replan of a version neither held nor loading, stops the
    engine naming what it waited for."""
    worlds = _Worlds(lost={"0-a"}, on_lost=lambda plan, version: engine._syncs.put(
        (_Sync(version, "1-b", replan=True), 0.0)))
    engine, events, fatal = _engine_with(tmp_path / "a", worlds)
    _run_syncs(engine, events, _Sync(1, "0-a"), _Sync(2, "1-b"),
               _Sync(2, "2-c", replan=True))
    assert fatal == [] and engine.error is None
    assert [e["weights_loaded"].version for e in events] == [1, 2]  # once each
    assert worlds.calls == [("receive", "0-a", 1), ("receive", "1-b", 1),
                            ("receive", "1-b", 2), ("enter", "2-c")]
    first = engine.syncs[0]
    assert (first["version"], first["plan_id"]) == (1, "0-a")
    assert [(r["plan_id"], r["lost"]) for r in first["replans"]] == [("1-b", "0-a")]
    assert "Connection closed" in first["replans"][0]["reason"]
    assert engine.syncs[1]["replans"] == []
    assert engine.quiet_replans == [{"version": 2, "plan_id": "2-c"}]
    assert engine.loaded[1] == engine.loaded[2] == weights_digest(worlds.state)

    # The replan queued before the sync starts: its plan only.
    worlds = _Worlds(lost={"0-a"})
    engine, events, fatal = _engine_with(tmp_path / "b", worlds)
    for sync in (_Sync(1, "0-a"), _Sync(1, "1-b", replan=True), None):
        engine._syncs.put(None if sync is None else (sync, 0.0))
    engine._sync_loop()
    assert worlds.calls == [("receive", "1-b", 1)] and fatal == []
    assert [e["weights_loaded"].version for e in events] == [1]
    assert [r["plan_id"] for r in engine.syncs[0]["replans"]] == ["1-b"]

    # No replan within the timeout: the engine stops, saying so.
    worlds = _Worlds(lost={"0-a"}, timeout=0.2)
    engine, events, fatal = _engine_with(tmp_path / "c", worlds)
    engine._syncs.put((_Sync(1, "0-a"), 0.0))
    engine._sync_loop()
    assert events == [] and len(fatal) == 1
    assert "no replan of it within" in fatal[0] and "0-a" in fatal[0], fatal

    # A replan of a version this engine neither holds nor is loading.
    worlds = _Worlds()
    engine, events, fatal = _engine_with(tmp_path / "d", worlds)
    _run_syncs(engine, events, _Sync(3, "1-b", replan=True))
    assert events == [] and len(fatal) == 1 and "neither holds" in fatal[0], fatal
