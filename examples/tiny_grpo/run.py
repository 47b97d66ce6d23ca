"""A real GRPO run on CPU: a tiny Llama-shaped policy learns to reverse digit strings,
with rlsched's runtime deciding what runs where.

    python3 examples/tiny_grpo/run.py --mode async --max-staleness 1 --partial-rollout \\
        --engines 2 --steps 20 --out /tmp/tiny-grpo

starts, as real processes on a Unix socket: ``rlsched run`` (the decision core, the step
planner, the weight-sync node), ``--engines`` engine workers and the trainer
(workers.py): ``--trainer-tp`` x ``--trainer-dp`` processes (default TP 2, DP 1), of
which rank 0 attaches to the runtime as the trainer worker and hands each call to the
others over their gloo group; the TP ranks train their slices of the model
(Megatron-style column- and row-parallel linears, tensor_parallel.py), the DP replicas
the step plan's ranks. rlsched carries ids and counts only; the samples' tokens,
logprobs and rewards go through ``OUT/data/samples/`` (one file per finished sample,
written atomically by the engine, read by the trainer). The weights move through
rlsched's executor over ``torch.distributed`` gloo by the runtime's own weight-sync
plans (``rlsched run --model config.json --train tp=T,dp=D --infer tp=1``: one plan per
membership of the engines, each worker sent its part with the transfer group to meet
in; trainer rank g rank g, ``members[k]`` rank T*D + k; each trainer rank sends its own
slices; every rank starts from the initial policy, version 0), or with ``--weights
file`` through ``OUT/data/weights/v<N>.pt`` (one file per version, written atomically by
trainer rank 0, loaded by the engines on SyncWeights).

Faults: ``--kill-engine-at STEP`` kills the last engine with SIGKILL in the middle of a
decode under the weights of step STEP (the engine, told so, stops after that decode and
says so; run.py kills it at once, its samples half generated). The runtime sends its
samples to the other engines again and plans the next weight sync for the survivors
(a new membership epoch: a new plan and transfer group, which the workers build a new
gloo world for, workers.py's PlanSync); the run must still finish every step, train
every sample once (the trainer's list; the engines' logs of what they finished, which a
SIGKILL leaves), count one engine failure, and every worker must have run the plans the
runtime made (its log's "weight-sync plan" lines), no other.
``--kill-engine-during-sync STEP`` has the last engine SIGKILL itself during the weight
sync of version STEP, once in that sync's gloo world and before the transfer completes
(workers.py ``--die-during-sync``): the runtime sends the other engines of that sync a
replan (the same version by a plan without the lost engine), the engines leave the
broken world for the new one and load the version there, and the trainer ranks, whose
run failed in the old world, move to it too; the run must finish every step as above,
with the RunReport counting the replans.

Writes to OUT: ``run.json`` (the run config, a SimulatorConfig: the same file runs in
``rlsched simulate --config``), ``report.json`` (rlsched's RunReport), ``summary.json``
(the report, the workers' own counts and the reward curve), ``rewards.csv`` (per step:
mean reward of the trained samples, tokens, micro-batches, the largest token staleness,
seconds), ``reward.png`` (reward against step and wall time, plot.py; skipped with a
message when matplotlib is absent), ``events.log`` (for ``rlsched replay``),
``trace.json`` (Perfetto) and each worker's log and report. Exit status 0 when the run
finished and every check held.

Finds the program at ``--rlsched-bin``, else ``$RLSCHED_BIN``, else ``build/rlsched``;
the Python modules at ``$PYTHONPATH``, else ``<repo>/python`` and ``<bin dir>/python``.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
# The trainer's default TP size (--trainer-tp).
TRAINER_TP = 2
_REPO = os.path.dirname(os.path.dirname(_HERE))
_PYTHON = sys.executable or "/usr/bin/python3"


def run_config(args) -> dict:
    orchestrator = {
        "prompts_per_step": args.prompts_per_step,
        "samples_per_prompt": args.samples_per_prompt,
    }
    if args.mode == "sync":
        orchestrator["mode"] = "ORCHESTRATOR_MODE_SYNC"
    elif args.mode == "one_step_off":
        orchestrator["mode"] = "ORCHESTRATOR_MODE_ONE_STEP_OFF"
    else:
        orchestrator.update({
            "mode": "ORCHESTRATOR_MODE_ASYNC",
            "max_staleness": args.max_staleness,
            "partial_rollout": bool(args.partial_rollout),
            # Every trained token at most max_staleness versions old (the trainer checks).
            "staleness_policy": "STALENESS_POLICY_STRICT",
        })
    prompt = args.digits + 2
    return {
        "orchestrator": orchestrator,
        "steps": args.steps,
        "engines": args.engines,
        "engine": {"max_concurrent": args.max_concurrent},
        "trainer_ranks": args.trainer_ranks,
        "step": {"max_tokens_per_micro_batch": args.max_tokens_per_micro_batch},
        "dataset_prompts": 1_000_000,
        "lengths": {"lengths": [args.digits + 1], "min_prompt_tokens": prompt,
                    "max_prompt_tokens": prompt},
        "seed": args.seed,
    }


def _paths(args):
    rlsched_bin = os.path.abspath(args.rlsched_bin or os.environ.get("RLSCHED_BIN")
                                  or os.path.join(_REPO, "build", "rlsched"))
    if not os.access(rlsched_bin, os.X_OK):
        raise SystemExit(f"run.py: rlsched program not found at {rlsched_bin} "
                         "(--rlsched-bin or $RLSCHED_BIN)")
    pythonpath = os.environ.get("PYTHONPATH") or os.pathsep.join(
        [os.path.join(_REPO, "python"), os.path.join(os.path.dirname(rlsched_bin), "python")])
    return rlsched_bin, pythonpath


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["sync", "one_step_off", "async"], default="async")
    parser.add_argument("--max-staleness", type=int, default=1, help="async only")
    parser.add_argument("--partial-rollout", action="store_true",
                        help="async only: interrupt generations at a weight sync and resume "
                        "them under the new weights (tokens kept)")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", required=True, help="the run's directory (made empty)")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--samples-per-prompt", type=int, default=8)
    parser.add_argument("--max-concurrent", type=int, default=32)
    parser.add_argument("--trainer-ranks", type=int, default=2,
                        help="data-parallel ranks of the step plan (run in one process)")
    parser.add_argument("--trainer-tp", type=int, default=TRAINER_TP,
                        help="the trainer's tensor-parallel size: one process per TP rank "
                        "(rank 0 attaches to the runtime, the others follow it), each "
                        "sending its own slices through the executor (rlsched run "
                        "--train tp=N)")
    parser.add_argument("--trainer-dp", type=int, default=1,
                        help="the trainer's data-parallel size: tp * dp processes; DP "
                        "replica d trains the step plan's ranks d, d + dp, ... (rlsched run "
                        "--train tp=N,dp=D)")
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=128)
    parser.add_argument("--engine-min-step-seconds", type=float, default=0.0,
                        help="each engine's decode step lasts at least this long (emulates "
                        "slower engines, so that generation, not training, is the bottleneck)")
    parser.add_argument("--late-engine-seconds", type=float, default=0.0,
                        help="engine 0 starts this many seconds after the others (the first "
                        "step waits for it: rlsched run --wait-for-engines)")
    parser.add_argument("--task", choices=("add", "reverse"), default="add",
                        help="add one to each digit, modulo the alphabet (default), or "
                             "reverse the digits (harder: GRPO settles near 0.8 here)")
    parser.add_argument("--digits", type=int, default=3)
    parser.add_argument("--alphabet", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=4,
                        help="optimizer steps per train step (each a pass over the batch)")
    parser.add_argument("--advantage", choices=["outcome", "process"], default="process",
                        help="GRPO's advantages: one per sample from the group-normalised "
                        "rewards (outcome), or per token from the group-normalised rewards "
                        "of the positions at and after it (process supervision)")
    parser.add_argument("--lr-end", type=float, default=None,
                        help="the learning rate goes linearly from --lr at step 0 to this "
                        "at the last step (default: constant)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0,
                        help="clip the gradient's norm (0: no clipping)")
    parser.add_argument("--entropy-coef", type=float, default=0.0,
                        help="entropy bonus per token")
    parser.add_argument("--clip-high", type=float, default=None,
                        help="the ratio's upper clip bound 1 + CLIP_HIGH (default: 1.2, "
                        "as the lower 0.8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-engine-at", type=int, default=None, metavar="STEP",
                        help="SIGKILL the last engine in the middle of its generation "
                        "under version STEP (the weights of step STEP); the run goes on "
                        "with the others")
    parser.add_argument("--kill-engine-during-sync", type=int, default=None, metavar="STEP",
                        help="the last engine SIGKILLs itself during the weight sync of "
                        "version STEP, in that sync's world before the transfer completes "
                        "(the runtime replans the sync for the others)")
    parser.add_argument("--weights", choices=["executor", "file"], default="executor",
                        help="how new weights reach the engines: rlsched's executor over "
                        "torch.distributed gloo (default), or a file per version")
    parser.add_argument("--weight-sync-address", default=None, metavar="HOST:PORT",
                        help="executor: where the weight-sync groups meet (a TCP store the "
                        "trainer serves, one prefix per group); default: a file per group "
                        "under OUT/data/stores")
    parser.add_argument("--rlsched-bin", default=None)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    if args.trainer_tp < 1:
        parser.error(f"--trainer-tp must be >= 1, got {args.trainer_tp}")
    if not 1 <= args.trainer_dp <= args.trainer_ranks:
        parser.error(f"--trainer-dp must be in [1, --trainer-ranks {args.trainer_ranks}] "
                     f"(DP replica d trains the step plan's ranks d, d + dp, ...), got "
                     f"{args.trainer_dp}")
    if args.mode != "async" and args.partial_rollout:
        parser.error("--partial-rollout needs --mode async")
    for option, step in (("--kill-engine-at", args.kill_engine_at),
                         ("--kill-engine-during-sync", args.kill_engine_during_sync)):
        if step is None:
            continue
        if args.engines < 2:
            parser.error(f"{option} needs --engines 2 or more (one must survive)")
        if not 1 <= step < args.steps:
            parser.error(f"{option} must be in [1, {args.steps - 1}] "
                         f"(--steps {args.steps}), got {step}")
    if args.kill_engine_during_sync is not None:
        if args.kill_engine_at is not None:
            parser.error("--kill-engine-during-sync and --kill-engine-at both kill the last "
                         "engine: give one")
        if args.weights != "executor":
            parser.error("--kill-engine-during-sync needs --weights executor (replans are "
                         "the weight-sync plans')")

    rlsched_bin, pythonpath = _paths(args)
    out = os.path.abspath(args.out)
    data = os.path.join(out, "data")
    if os.path.exists(data):
        shutil.rmtree(data)
    for sub in ("samples", "partial", "weights"):
        os.makedirs(os.path.join(data, sub))
    config_path = os.path.join(out, "run.json")
    with open(config_path, "w") as f:
        json.dump(run_config(args), f, indent=1)
    token_path = os.path.join(out, "token")
    with open(token_path, "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    os.chmod(token_path, 0o600)
    with open(token_path) as f:
        token = f.read().strip()

    sys.path[:0] = [_HERE, *pythonpath.split(os.pathsep)]
    import torch

    from model import Config, load_model
    from tensor_parallel import check_tp
    from workers import publish_weights
    try:
        check_tp(Config.load(), args.trainer_tp)
    except ValueError as e:
        parser.error(f"--trainer-tp: {e}")
    torch.set_num_threads(1)
    publish_weights(data, 0, load_model(seed=args.seed))  # the initial policy, version 0
    # The weight layout: the runtime plans each membership's sync (trainer TP 1 ->
    # engines TP 1 x the members) and sends every worker its part.
    layout = []
    if args.weights == "executor":
        layout = ["--model", os.path.join(_HERE, "config.json"), "--train",
                  f"tp={args.trainer_tp},dp={args.trainer_dp}",
                  "--infer", "tp=1", "--weight-sync-backend", "gloo"]
        if args.weight_sync_address:
            layout += ["--weight-sync-address", args.weight_sync_address]

    sock_dir = out if len(out) < 80 else tempfile.mkdtemp(prefix="tiny-grpo-")
    socket = f"unix:{os.path.join(sock_dir, 'run.sock')}"
    if os.path.exists(socket[5:]):
        os.unlink(socket[5:])
    env = dict(os.environ, PYTHONPATH=pythonpath, RLSCHED_WORKER_TOKEN=token,
               OMP_NUM_THREADS="1")
    start = time.monotonic()
    logs = {}

    def log(name):
        logs[name] = open(os.path.join(out, f"{name}.log"), "w")
        return logs[name]

    program = subprocess.Popen(
        # --log-level info: the log names every weight-sync plan the runtime makes (the
        # summary checks the workers' worlds against them).
        [rlsched_bin, "--log-level", "info", "run", "--config", config_path, "--listen", socket,
         "--token-file", token_path, "--event-log", os.path.join(out, "events.log"), "--trace",
         os.path.join(out, "trace.json"), "--json", "--timeout", str(args.timeout),
         # The first step starts on every engine: one that starts late would otherwise
         # join after the first weight sync, a new membership (and world) mid-run.
         "--wait-for-engines", str(args.engines), *layout],
        stdout=subprocess.PIPE, stderr=log("rlsched"), text=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(socket[5:]):
        if program.poll() is not None or time.monotonic() > deadline:
            program.kill()
            raise SystemExit(f"run.py: rlsched run did not listen (see {out}/rlsched.log)")
        time.sleep(0.02)

    common = ["--address", socket, "--data", data, "--weights", args.weights,
              "--task", args.task, "--digits", str(args.digits),
              "--alphabet", str(args.alphabet), "--seed", str(args.seed)]
    workers = {}
    killing = args.kill_engine_at is not None or args.kill_engine_during_sync is not None
    victim = f"engine{args.engines - 1}" if killing else None
    for e in range(args.engines):
        name = f"engine{e}"
        stall = []
        if name == victim:
            stall = (["--stall-at-version", str(args.kill_engine_at)]
                     if args.kill_engine_at is not None else
                     ["--die-during-sync", str(args.kill_engine_during_sync)])
        late = (["sh", "-c", f'sleep {args.late_engine_seconds}; exec "$@"', "sh"]
                if e == 0 and args.late_engine_seconds > 0 else [])
        workers[name] = subprocess.Popen(
            [*late, _PYTHON, os.path.join(_HERE, "workers.py"), "--role", "engine", "--engine",
             str(e),
             "--max-concurrent", str(args.max_concurrent), "--min-step-seconds",
             str(args.engine_min_step_seconds), "--report",
             os.path.join(out, f"{name}.json"), *stall, *common],
            env=env, stdout=log(name), stderr=subprocess.STDOUT)
    trainer_args = [
        _PYTHON, os.path.join(_HERE, "workers.py"), "--role", "trainer", "--lr", str(args.lr),
        "--epochs", str(args.epochs), "--advantage", args.advantage, "--max-grad-norm",
        str(args.max_grad_norm), "--entropy-coef", str(args.entropy_coef),
        *(["--lr-end", str(args.lr_end)] if args.lr_end is not None else []),
        *(["--clip-high", str(args.clip_high)] if args.clip_high is not None else []),
        "--tp", str(args.trainer_tp), "--dp", str(args.trainer_dp), "--tp-timeout",
        str(args.timeout + 60), *common]
    # Trainer rank 0 attaches to the runtime; ranks 1.. (trainer1, ...) follow it.
    for r in range(1, args.trainer_tp * args.trainer_dp):
        workers[f"trainer{r}"] = subprocess.Popen(
            [*trainer_args, "--trainer-rank", str(r), "--report",
             os.path.join(out, f"trainer{r}.json")],
            env=env, stdout=log(f"trainer{r}"), stderr=subprocess.STDOUT)
    workers["trainer"] = subprocess.Popen(
        [*trainer_args, "--trainer-rank", "0", "--csv", os.path.join(out, "rewards.csv"),
         "--report", os.path.join(out, "trainer.json")],
        env=env, stdout=log("trainer"), stderr=subprocess.STDOUT)

    # The run; with --kill-engine-at, the victim is killed as soon as it says it stalled
    # in the middle of a decode (samples half generated).
    killed = None
    stalled_path = os.path.join(data, f"stalled.{victim}")
    deadline = time.monotonic() + args.timeout + 60
    failed = None
    while program.poll() is None and time.monotonic() < deadline:
        # A worker that failed (other than the victim) leaves the run unable to finish:
        # stop it now rather than at its timeout.
        failed = failed or next((n for n, p in workers.items()
                                 if n != victim and p.poll() not in (None, 0)), None)
        if failed:
            print(f"run.py: {failed} exited with status {workers[failed].returncode} "
                  f"(see {out}/{failed}.log); stopping the run", file=sys.stderr)
            program.terminate()
            break
        if victim and killed is None and os.path.exists(stalled_path):
            workers[victim].send_signal(signal.SIGKILL)
            with open(stalled_path) as f:
                killed = {"engine": victim, "wall_seconds": round(time.monotonic() - start, 3),
                          **json.load(f)}
        time.sleep(0.005 if victim and killed is None else 0.05)
    if program.poll() is None:
        program.kill()
    stdout, _ = program.communicate()
    wall = time.monotonic() - start
    dying_path = os.path.join(data, f"dying.{victim}")
    if args.kill_engine_during_sync is not None and os.path.exists(dying_path):
        with open(dying_path) as f:  # the victim killed itself, saying where
            dying = json.load(f)
        killed = {**dying, "engine": victim, "wall_seconds": None, "during_sync": True}
    statuses = {}
    for name, process in workers.items():
        try:
            statuses[name] = process.wait(timeout=5 if failed else 60)
        except subprocess.TimeoutExpired:
            process.kill()
            statuses[name] = process.wait()
    for f in logs.values():
        f.close()

    try:
        report = json.loads(stdout)
    except ValueError:
        print(f"run.py: rlsched run gave no report (status {program.returncode}); "
              f"see {out}/rlsched.log", file=sys.stderr)
        return 1
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    reports = {}
    for name in workers:
        try:
            with open(os.path.join(out, f"{name}.json")) as f:
                reports[name] = json.load(f)
        except (OSError, ValueError):
            reports[name] = None
    finished_logs = {}
    for e in range(args.engines):
        try:
            with open(os.path.join(data, f"finished.engine{e}")) as f:
                finished_logs[f"engine{e}"] = [int(x) for x in f.read().split()]
        except OSError:
            finished_logs[f"engine{e}"] = []
    summary = summarize(args, report, reports, statuses, wall, killed, finished_logs,
                        runtime_plans(os.path.join(out, "rlsched.log")),
                        plan_files=sorted(n for n in os.listdir(data) if n.startswith("plan")))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if os.path.exists(os.path.join(out, "rewards.csv")):
        from plot import plot  # optional: matplotlib absent, it says so and draws nothing
        plot([out], os.path.join(out, "reward.png"))
    print(json.dumps({k: summary[k] for k in ("mode", "steps", "wall_seconds",
                                              "samples_per_second", "first_reward",
                                              "last_reward", "checks")}))
    return 0 if summary["ok"] else 1


_PLAN_LINE = re.compile(r"weight-sync plan ((\d+)-[0-9a-f]+): engines \[([0-9, ]*)\]")


def runtime_plans(log_path: str) -> dict:
    """The weight-sync plans ``rlsched run`` made, from its log: {plan id: {"epoch",
    "members"}}."""
    plans = {}
    try:
        with open(log_path) as f:
            for line in f:
                m = _PLAN_LINE.search(line)
                if m:
                    plans[m.group(1)] = {"epoch": int(m.group(2)), "members": [
                        int(x) for x in m.group(3).replace(",", " ").split()]}
    except OSError:
        pass
    return plans


def plans_problems(plans: dict, reports: dict, trainer_ranks: int = 1) -> list:
    """Where the worlds the workers joined differ from the runtime's plans: each one a
    plan the runtime made (id, epoch, members, group), the worker a member of it at
    its rank (trainer rank r: r; engine members[k]: trainer_ranks + k), and each
    worker's last world one it ran."""
    problems = []
    for name, r in reports.items():
        worlds = ((r or {}).get("weight_sync") or {}).get("epochs") or []
        for w in worlds:
            plan = plans.get(w["plan_id"])
            if plan is None:
                problems.append(f"{name}: plan {w['plan_id']} not made by the runtime")
                continue
            if (w["epoch"], w["members"]) != (plan["epoch"], plan["members"]):
                problems.append(f"{name}: plan {w['plan_id']}: epoch/members {w['epoch']}/"
                                f"{w['members']}, the runtime's {plan['epoch']}/{plan['members']}")
            if w["group"] != "rlsched-weights-" + w["plan_id"]:
                problems.append(f"{name}: plan {w['plan_id']}: group {w['group']}")
            if name.startswith("trainer"):
                rank = int(name[len("trainer"):] or 0)
            else:
                engine = int(name[len("engine"):])
                rank = (trainer_ranks + plan["members"].index(engine)
                        if engine in plan["members"] else None)
            world = trainer_ranks + len(plan["members"])
            if w["rank"] != rank or w["world_size"] != world:
                problems.append(f"{name}: plan {w['plan_id']}: rank {w['rank']} of "
                                f"{w['world_size']}, the plan's {rank} of {world}")
        if r and worlds and worlds[-1]["runs"] == 0:
            problems.append(f"{name}: no run in its last world ({worlds[-1]['plan_id']})")
    return problems


def _sync_figures(syncs: list) -> dict:
    seconds = sorted(s["seconds"] for s in syncs)
    if not seconds:
        return {"syncs": 0}
    return {"syncs": len(seconds), "median_seconds": seconds[len(seconds) // 2],
            "max_seconds": seconds[-1]}


def summarize(args, report, reports, statuses, wall, killed=None, finished_logs=None,
              plans=None, plan_files=()) -> dict:
    counters = report.get("counters", {})
    trainer = reports.get("trainer") or {}
    trained = trainer.get("trained", [])
    engines = {n: r for n, r in reports.items() if n.startswith("engine")}
    steps = trainer.get("steps", [])
    curve = [s["mean_reward"] for s in steps]
    published = trainer.get("published", {})
    # Every version an engine loaded must be byte-identical to the one the trainer made.
    mismatched = [(n, v) for n, r in engines.items() if r
                  for v, digest in r.get("loaded", {}).items()
                  if published.get(v) != digest]
    loads = sum(len(r.get("loaded", {})) for r in engines.values() if r)
    victim = killed["engine"] if killed else None
    # The engines' own counts (their logs of finished samples, which a SIGKILL leaves).
    finished_logs = finished_logs or {}
    generated = set().union(*finished_logs.values()) if finished_logs else set()
    checks = {
        "done": bool(report.get("done")),
        "workers_exited_cleanly": all(s == (-signal.SIGKILL if n == victim else 0)
                                      for n, s in statuses.items()),
        "trained_each_once": (len(trained) == len(set(trained)) ==
                              int(counters.get("trained", -1)) ==
                              args.steps * args.prompts_per_step * args.samples_per_prompt),
        "trained_were_generated": set(trained) <= generated,
        "staleness_bound": trainer.get("staleness_violations", -1) == 0,
        "lengths_agree": trainer.get("length_mismatches", -1) == 0,
        # Samples with tokens of more than one version, from the engines' per-token
        # versions, are the runtime's partial samples, and no others.
        "partial_samples_counted": (trainer.get("partial_samples", -1) ==
                                    int(counters.get("partial_samples", 0))),
        "weights_identical": not mismatched and loads > 0,
        "weight_sync_clean": trainer.get("sync_error") is None,
    }
    trainer_tp = getattr(args, "trainer_tp", 1)
    trainer_dp = getattr(args, "trainer_dp", 1)
    trainer_ranks = trainer_tp * trainer_dp
    if trainer_ranks > 1:
        # Every trainer rank trained every call and published with rank 0, and sent its
        # own tensors without an error (their reports, and rank 0's copy of them).
        followers = [reports.get(f"trainer{r}") or {} for r in range(1, trainer_ranks)]
        calls = len(steps)
        checks["trainer_ranks_followed"] = (
            [r.get("rank") for r in trainer.get("ranks", [])] == list(range(trainer_ranks))
            and all(len(f.get("steps", [])) == calls and f.get("sync_error") is None
                    for f in followers))
    plans = plans or {}
    sync_problems = []
    if args.weights == "executor":
        # The workers moved the weights by the runtime's plans (their worlds: the
        # runtime's plan ids, epochs, members, groups and ranks), none of their own.
        sync_problems = plans_problems(plans, reports, trainer_ranks)
        if plan_files:
            sync_problems.append(f"plan files in the data directory: {list(plan_files)}")
        if not plans:
            sync_problems.append("the runtime's log names no weight-sync plan")
        checks["weight_sync_by_runtime_plans"] = not sync_problems
    if getattr(args, "kill_engine_during_sync", None) is not None:
        # Killed during the sync of that version, in its world; the runtime counted one
        # engine failure, sent the others the sync again by a plan without it (a
        # replan), and planned that membership (its epochs: one without the victim).
        members = [e.get("members", []) for e in report.get("weight_sync", [])]
        lost = int(victim[len("engine"):]) if victim else -1
        checks["engine_killed_during_sync"] = bool(
            killed and killed.get("version") == args.kill_engine_during_sync
            and int(counters.get("engine_failures", 0)) == 1
            and int(report.get("weight_sync_replans", 0)) > 0
            and any(m and lost not in [int(x) for x in m] for m in members))
    if args.kill_engine_at is not None:
        # Killed mid-generation (samples in flight, which the runtime requeued), and the
        # runtime counted one engine failure.
        checks["engine_killed_mid_generation"] = bool(
            killed and killed.get("running", 0) > 0
            and int(counters.get("engine_failures", 0)) == 1
            and int(counters.get("restarts", 0)) >= 1)
    head = curve[:max(1, len(curve) // 4)]
    tail = curve[-max(1, len(curve) // 4):]
    return {
        "mode": args.mode,
        "max_staleness": args.max_staleness if args.mode == "async" else
        (1 if args.mode == "one_step_off" else 0),
        "partial_rollout": bool(args.partial_rollout),
        "engines": args.engines,
        "trainer_tp": trainer_tp,
        "trainer_dp": trainer_dp,
        "steps": len(steps),
        "samples_trained": len(trained),
        "wall_seconds": round(wall, 3),
        "samples_per_second": round(len(trained) / wall, 3) if wall > 0 else 0.0,
        "reward_curve": curve,
        "first_reward": round(sum(head) / len(head), 4) if curve else None,
        "last_reward": round(sum(tail) / len(tail), 4) if curve else None,
        "max_token_staleness": max((s["max_token_staleness"] for s in steps), default=None),
        "engine_finished": {n: len(v) for n, v in finished_logs.items()},
        "trained_by_engine": trainer.get("trained_by_engine"),
        "killed": killed,
        "weight_sync_epochs": (trainer.get("weight_sync") or {}).get("epochs"),
        # The runtime's: each membership's plan (members, transfers, bytes, syncs) and
        # the syncs it sent again because an engine was lost during them.
        "runtime_weight_sync": report.get("weight_sync"),
        "weight_sync_replans": int(report.get("weight_sync_replans", 0)),
        "runtime_plans": plans,
        "weight_sync_problems": sync_problems,
        # Seconds per run of the plan (the executor's transfer time; the trainer's side
        # and each engine's), and those spent joining worlds (rendezvous, checks, groups).
        "weight_sync": {n: {k: (r.get("weight_sync") or {}).get(k)
                            for k in ("runs", "seconds_per_run", "join_seconds")}
                        for n, r in reports.items() if r and r.get("weight_sync")},
        # Each engine's syncs as it saw them (SyncWeights taken to weights committed):
        # their count, median and largest seconds.
        "engine_syncs": {n: _sync_figures(r.get("syncs") or [])
                         for n, r in engines.items() if r},
        "engine_interrupts": {n: r.get("interrupts") if r else None for n, r in engines.items()},
        "partial_samples": trainer.get("partial_samples"),
        "resumed_tokens": sum((r or {}).get("resumed_tokens", 0) for r in engines.values()),
        "weight_loads": loads,
        "weights_mismatched": mismatched,
        "counters": counters,
        "checks": checks,
        "ok": all(checks.values()),
    }


if __name__ == "__main__":
    sys.exit(main())
