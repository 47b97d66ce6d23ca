"""The tiny GRPO run's workers: engines that sample the tiny model with a KV cache and a
trainer that trains it with GRPO, attached to ``rlsched run`` over gRPC.

The control plane (rlsched) carries ids and counts only. The data plane is a shared
directory (``--data DIR``):

- ``samples/<sample>.json``: one file per finished sample, written atomically by the
  engine that finished it (prompt and response tokens, the engine's logprob and weights
  version of every response token, the reward), read by the trainer when a StartTrain
  lists the sample;
- ``partial/<sample>.json``: the tokens of a sample an interrupting SyncWeights paused
  (partial rollout), so that it can be resumed from them;
- ``weights/v0.pt``: the initial policy (a state dict with the HF Llama names, written
  by run.py before anything starts), which the trainer loads.

Weights move one of two ways (``--weights``):

- ``executor`` (default): rlsched's executor over ``torch.distributed`` gloo. The trainer
  is rank 0 and engine e is rank 1 + e of one world (a FileStore under the data
  directory); every rank runs the plan ``rlsched reshard --train tp=1 --infer
  tp=1,replicas=E --plan-out plan.json`` gives (run.py makes it). The trainer hands its
  Megatron-named tensors (``linear_qkv`` fused per query group, ``linear_fc1`` = gate and
  up, the vocabulary padded to 128 rows) to a sync thread that runs the plan once per
  version, in order; an engine, on SyncWeights(N), runs it until it holds version N
  (once per version it has not received) into vLLM-named tensors (``qkv_proj``,
  ``gate_up_proj``, the vocabulary padded to 64 rows), which it splits back into its
  HF-named parameters. Every version goes to every engine: the engines must all sync
  to every version (the case in sync mode and in async mode with partial rollout,
  where a sync interrupts every engine at once).
- ``file``: the trainer writes ``weights/v<N>.pt`` atomically before it reports the step
  that made it finished; an engine loads it on SyncWeights(version N).

Run one with ``python3 workers.py --role engine|trainer --address unix:PATH --data DIR
[--engine N] --report FILE``; run.py starts them.
"""

import argparse
import json
import os
import queue
import sys
import threading
import time
from typing import Dict, List, Optional

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from grpo import Rollout, decode_step, group_advantages, policy_loss, sample_seed  # noqa: E402
from model import CONFIG_PATH, TinyLlama, Config, weights_digest  # noqa: E402
from task import ReverseTask  # noqa: E402

from rlsched.v1 import rollout_pb2  # noqa: E402
from rlsched.worker import EngineWorker, TrainerWorker  # noqa: E402

# The runtime takes an interrupting sync's pause as one GenerationPaused report where
# its protocol has it, else one GenerationProgressed per sample.
_BATCHED_PAUSE = hasattr(rollout_pb2, "GenerationPaused") and hasattr(EngineWorker, "paused")


def write_json_atomic(path: str, data) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def weights_path(data: str, version: int) -> str:
    return os.path.join(data, "weights", f"v{version}.pt")


def publish_weights(data: str, version: int, model) -> str:
    """Writes version `version` atomically; returns its digest."""
    path = weights_path(data, version)
    tmp = f"{path}.tmp.{os.getpid()}"
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, tmp)
    os.replace(tmp, path)
    return weights_digest(state)


def load_weights(data: str, version: int, model, timeout: float = 120.0) -> None:
    path = weights_path(data, version)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"weights version {version} not published at {path} "
                               f"within {timeout} s")
        time.sleep(0.01)
    model.load_state_dict(torch.load(path))


def _read_json(path: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class ExecutorSync:
    """One rank's side of the weight sync over rlsched's executor (gloo): rank 0 the
    trainer (TP 1), ranks 1..E the engines (TP 1 each)."""

    def __init__(self, rank: int, world: int, store: str, plan_path: str,
                 timeout_seconds: float = 120.0):
        import datetime

        import torch.distributed as dist

        from rlsched import executor
        from rlsched import executor_layouts as lay

        self.lay = lay
        timeout = datetime.timedelta(seconds=timeout_seconds)
        dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                                world_size=world, timeout=timeout)
        with open(CONFIG_PATH) as f:
            self.layout = lay.parse_config(f.read())
        self.config = Config.load(CONFIG_PATH)
        self.infer = lay.Infer(tp=1, replicas=world - 1)
        zeros = {name: torch.zeros(shape, dtype=dtype)
                 for name, (shape, dtype) in lay.hf_shapes(self.layout).items()}
        self.rank = rank
        self.sources, self.destinations = None, None
        if rank == 0:
            self.sources = lay.megatron_shards(self.layout, lay.Train(), 0, zeros)
        else:
            self.destinations = {k: torch.zeros_like(v) for k, v in
                                 lay.vllm_shards(self.layout, self.infer, 0, zeros).items()}
        # Collective: every rank checks the plan against this world's layouts and its
        # tensors before any byte moves.
        self.executor = executor.Executor(executor.load_plan(plan_path, rank),
                                          sources=self.sources,
                                          destinations=self.destinations, timeout=timeout,
                                          layout=executor.world_layout(lay.Train(), self.infer))
        self.runs = 0
        self.bytes = 0
        self.seconds = 0.0

    def send(self, state) -> None:
        """Trainer: this HF-named state in the Megatron layout, then one run of the plan."""
        fresh = self.lay.megatron_shards(self.layout, self.lay.Train(), 0, state)
        with torch.no_grad():
            for name, tensor in fresh.items():
                self.sources[name].copy_(tensor)
        self._run()

    def receive(self) -> Dict[str, torch.Tensor]:
        """Engine: one run of the plan; the received vLLM tensors as HF-named ones."""
        self._run()
        c, d = self.config, self.destinations
        q = c.num_attention_heads * c.head_dim
        kv = c.num_key_value_heads * c.head_dim
        state = {"model.embed_tokens.weight": d["model.embed_tokens.weight"][:c.vocab_size],
                 "lm_head.weight": d["lm_head.weight"][:c.vocab_size],
                 "model.norm.weight": d["model.norm.weight"]}
        for n in range(c.num_hidden_layers):
            p = f"model.layers.{n}."
            qkv = d[p + "self_attn.qkv_proj.weight"]
            gate_up = d[p + "mlp.gate_up_proj.weight"]
            state.update({
                p + "self_attn.q_proj.weight": qkv[:q],
                p + "self_attn.k_proj.weight": qkv[q:q + kv],
                p + "self_attn.v_proj.weight": qkv[q + kv:q + 2 * kv],
                p + "self_attn.o_proj.weight": d[p + "self_attn.o_proj.weight"],
                p + "mlp.gate_proj.weight": gate_up[:c.intermediate_size],
                p + "mlp.up_proj.weight": gate_up[c.intermediate_size:],
                p + "mlp.down_proj.weight": d[p + "mlp.down_proj.weight"],
                p + "input_layernorm.weight": d[p + "input_layernorm.weight"],
                p + "post_attention_layernorm.weight": d[p + "post_attention_layernorm.weight"],
            })
        return {k: v.clone() for k, v in state.items()}

    def _run(self) -> None:
        stats = self.executor.run()
        self.runs += 1
        self.bytes += stats.bytes_sent + stats.bytes_received
        self.seconds += stats.transfer_seconds

    def report(self) -> dict:
        return {"runs": self.runs, "bytes": self.bytes, "seconds": round(self.seconds, 6)}


class TinyEngine(EngineWorker):
    """Continuous batching over the running samples (one decode step gives each one a
    token; rows of equal context length run as one batch), a KV cache per sample that a
    weight update invalidates (the prefix is prefilled again on resume)."""

    def __init__(self, address: str, engine: int, max_concurrent: int, *, data: str,
                 task: ReverseTask, min_step_seconds: float = 0.0,
                 weight_sync: Optional[ExecutorSync] = None, **kwargs):
        super().__init__(address, engine, max_concurrent, **kwargs)
        self.data = data
        self.weight_sync = weight_sync
        self.received = -1  # executor: the last version received
        self.min_step_seconds = min_step_seconds
        self.task = task
        self.model = TinyLlama(Config.load(CONFIG_PATH))
        self.model.eval()
        self._lock = threading.Condition()
        self._running: Dict[int, Rollout] = {}
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self.finished_samples: List[int] = []
        self.loaded: Dict[int, str] = {}  # version -> digest of the engine's own weights
        self.interrupts = 0
        self.resumed_tokens = 0
        self.error: Optional[str] = None

    def on_welcome(self, welcome) -> None:
        self.seed = welcome.config.seed
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    # ---- Commands. ----

    def dispatch(self, dispatch) -> None:
        with self._lock:
            for work in dispatch.samples:
                r = Rollout(work.sample, work.group, work.prompt, self.task.prompt(work.prompt),
                            self.task.max_new_tokens,
                            sample_seed(self.seed, work.sample, work.resume_from))
                if len(r.prompt) != work.prompt_tokens:
                    self._fail(f"sample {work.sample}: prompt_tokens {work.prompt_tokens} but "
                               f"the task's prompt has {len(r.prompt)}")
                if work.resume_from > 0:
                    partial = _read_json(self._partial_path(work.sample))
                    if len(partial["response"]) < work.resume_from:
                        self._fail(f"sample {work.sample}: resume_from {work.resume_from} > "
                                   f"{len(partial['response'])} tokens kept")
                    n = work.resume_from
                    r.response = partial["response"][:n]
                    r.logprobs = partial["logprobs"][:n]
                    r.versions = partial["versions"][:n]
                    self.resumed_tokens += n
                self._running[work.sample] = r
            self._lock.notify()

    def abort(self, abort) -> None:
        with self._lock:
            for sample in abort.samples:
                self._running.pop(sample, None)

    def sync_weights(self, sync) -> None:
        with self._lock:
            if sync.interrupt:
                self.interrupts += 1
                for r in self._running.values():
                    if not r.paused:
                        r.paused = True
                        write_json_atomic(self._partial_path(r.sample), {
                            "response": r.response, "logprobs": r.logprobs,
                            "versions": r.versions})
                progress = [(r.sample, len(r.response)) for r in self._running.values()]
                if _BATCHED_PAUSE:  # one GenerationPaused: the pause's acknowledgement
                    self.paused(sync.version, progress)
                else:  # an older runtime: a GenerationProgressed per sample
                    for sample, tokens in progress:
                        self.progressed(sample, tokens)
            if self.weight_sync is None:
                load_weights(self.data, sync.version, self.model)
            else:
                # Every version in order: the trainer runs the plan once per version.
                if sync.version <= self.received:
                    self._fail(f"SyncWeights to version {sync.version}, but version "
                               f"{self.received} was received already")
                while self.received < sync.version:
                    state = self.weight_sync.receive()
                    self.received += 1
                self.model.load_state_dict(state)
            self.loaded[sync.version] = weights_digest(self.model.state_dict())
            for r in self._running.values():
                r.cache = None  # no KV cache survives a weight update
            self.weights_loaded(sync.version)
            self._lock.notify()

    def resume(self, resume) -> None:
        with self._lock:
            for sample in resume.samples:
                r = self._running.get(sample)
                if r is not None:
                    r.paused = False
                    r.cache = None
            self._lock.notify()

    def release(self, release) -> None:
        self.released()

    def on_stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()

    # ---- Generation (the loop thread). ----

    def _partial_path(self, sample: int) -> str:
        return os.path.join(self.data, "partial", f"{sample}.json")

    def _fail(self, message: str) -> None:
        self.error = message
        raise RuntimeError(message)

    def _loop(self) -> None:
        with self._lock:
            while not self._stop:
                active = [r for r in self._running.values() if not r.paused and not r.done]
                if not active:
                    self._lock.wait(timeout=0.5)
                    continue
                start = time.monotonic()
                decode_step(self.model, active, self.version)
                for r in active:
                    if r.done:
                        self._finish(r)
                # Pacing (a slower engine): commands are taken while it waits.
                deadline = start + self.min_step_seconds
                while not self._stop and time.monotonic() < deadline:
                    self._lock.wait(timeout=deadline - time.monotonic())

    def _finish(self, r: Rollout) -> None:
        del self._running[r.sample]
        reward = self.task.reward(r.prompt_id, r.response)
        write_json_atomic(os.path.join(self.data, "samples", f"{r.sample}.json"), {
            "sample": r.sample, "group": r.group, "prompt_id": r.prompt_id,
            "prompt": r.prompt, "response": r.response, "logprobs": r.logprobs,
            "versions": r.versions, "reward": reward, "engine": self.engine})
        self.finished_samples.append(r.sample)
        self.finished(r.sample, len(r.response), reward)

    def report(self) -> dict:
        return {"finished": self.finished_samples, "loaded": self.loaded,
                "weight_sync": self.weight_sync.report() if self.weight_sync else None,
                "interrupts": self.interrupts, "resumed_tokens": self.resumed_tokens,
                "error": self.error}


class TinyTrainer(TrainerWorker):
    """Trains each call on the samples it lists, in the step plan's ranks and
    micro-batches (the ranks' gradients accumulate in this one process: data parallel
    in one process, tensor parallel 1), one optimizer step per step (``epochs`` passes,
    each an optimizer step), then publishes the new version and reports the step."""

    def __init__(self, address: str, *, data: str, lr: float, epochs: int, seed: int,
                 csv_path: Optional[str] = None, weight_sync: Optional[ExecutorSync] = None,
                 **kwargs):
        super().__init__(address, **kwargs)
        self.data = data
        self.weight_sync = weight_sync
        self.sync_error: Optional[str] = None
        self.epochs = epochs
        torch.manual_seed(seed)
        self.model = TinyLlama(Config.load(CONFIG_PATH))
        load_weights(data, 0, self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.trained: List[int] = []
        self.published: Dict[int, str] = {0: weights_digest(self.model.state_dict())}
        if weight_sync is not None:
            # The sync thread sends every version in order (version 0 first).
            self._versions: "queue.Queue" = queue.Queue()
            self._sending = threading.Condition()
            self._queued, self._sent = 1, 0
            self._versions.put(self._snapshot())
            threading.Thread(target=self._send_versions, daemon=True).start()
        self.steps: List[dict] = []
        self.staleness_violations = 0
        self.length_mismatches = 0
        self.partial_samples = 0  # trained samples with tokens of more than one version
        self.csv_path = csv_path
        self.start = time.monotonic()
        if csv_path:
            with open(csv_path, "w") as f:
                f.write("step,mean_reward,samples,tokens,micro_batches,max_token_staleness,"
                        "train_seconds,wall_seconds\n")

    def on_welcome(self, welcome) -> None:
        config = welcome.config
        self.samples_per_prompt = config.orchestrator.samples_per_prompt
        self.max_staleness = config.orchestrator.max_staleness
        self.calls_per_sync = max(1, config.orchestrator.train_calls_per_sync)

    def start_train(self, call) -> None:
        t0 = time.monotonic()
        items = []
        max_stale = 0
        for i, sample in enumerate(call.samples):
            s = _read_json(os.path.join(self.data, "samples", f"{sample}.json"))
            if len(s["prompt"]) + len(s["response"]) != call.lengths[i]:
                self.length_mismatches += 1
            stale = max(call.step - v for v in s["versions"])
            if len(set(s["versions"])) > 1:
                self.partial_samples += 1
            max_stale = max(max_stale, stale)
            if stale > self.max_staleness:
                self.staleness_violations += 1
            items.append(s)
        # GRPO advantages within each group (a call holds whole groups).
        groups: Dict[int, List[dict]] = {}
        for s in items:
            groups.setdefault(s["sample"] // self.samples_per_prompt, []).append(s)
        for rows in groups.values():
            for s, a in zip(rows, group_advantages([s["reward"] for s in rows])):
                s["advantage"] = a
        tokens = sum(len(s["response"]) for s in items)
        plan = [[list(mb.indices) for mb in rank.micro_batches] for rank in call.plan.ranks]
        if not plan:
            plan = [[list(range(len(items)))]]
        micro_batches = sum(1 for rank in plan for mb in rank if mb)
        self.model.train()
        for _ in range(self.epochs):
            self.optimizer.zero_grad()
            for rank in plan:
                for mb in rank:
                    if mb:
                        loss, _ = policy_loss(self.model, [items[i] for i in mb])
                        # A token mean over the whole call, whatever the split.
                        (loss / tokens).backward()
            self.optimizer.step()
        self.trained.extend(call.samples)
        mean_reward = sum(s["reward"] for s in items) / len(items)
        record = {"step": call.step, "call": call.call, "mean_reward": mean_reward,
                  "samples": len(items), "tokens": tokens, "micro_batches": micro_batches,
                  "max_token_staleness": max_stale,
                  "train_seconds": time.monotonic() - t0,
                  "wall_seconds": time.monotonic() - self.start}
        if call.call == self.calls_per_sync - 1:
            if self.weight_sync is None:
                self.published[call.step + 1] = publish_weights(self.data, call.step + 1,
                                                                self.model)
            else:
                snapshot = self._snapshot()
                self.published[call.step + 1] = weights_digest(snapshot)
                with self._sending:
                    self._queued += 1
                self._versions.put(snapshot)
        self.steps.append(record)
        if self.csv_path:
            with open(self.csv_path, "a") as f:
                f.write(",".join(str(round(record[k], 6) if isinstance(record[k], float)
                                     else record[k])
                                 for k in ("step", "mean_reward", "samples", "tokens",
                                           "micro_batches", "max_token_staleness",
                                           "train_seconds", "wall_seconds")) + "\n")
        self.step_finished(call.step, call.call)

    def _snapshot(self) -> Dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def _send_versions(self) -> None:
        try:
            while True:
                self.weight_sync.send(self._versions.get())
                with self._sending:
                    self._sent += 1
                    self._sending.notify_all()
        except Exception as e:  # a lost engine: the collective times out
            with self._sending:
                self.sync_error = f"{type(e).__name__}: {e}"
                self._sending.notify_all()
            print(f"trainer: weight sync failed: {self.sync_error}", file=sys.stderr, flush=True)

    def drain(self, timeout: float = 60.0) -> None:
        """Waits until the engines took every version published (the last sync of a run
        may still be moving when the run says goodbye); the trainer must not leave the
        gloo world before."""
        if self.weight_sync is None:
            return
        with self._sending:
            if not self._sending.wait_for(
                    lambda: self._sent == self._queued or self.sync_error is not None,
                    timeout=timeout):
                self.sync_error = (f"the engines took {self._sent} of {self._queued} versions "
                                   f"within {timeout} s of the end")

    def report(self) -> dict:
        return {"trained": self.trained,
                "weight_sync": self.weight_sync.report() if self.weight_sync else None,
                "sync_error": self.sync_error, "published": self.published, "steps": self.steps,
                "staleness_violations": self.staleness_violations,
                "max_staleness": self.max_staleness,
                "length_mismatches": self.length_mismatches,
                "partial_samples": self.partial_samples}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["engine", "trainer"], required=True)
    parser.add_argument("--address", required=True, help="unix:PATH or HOST:PORT")
    parser.add_argument("--data", required=True, help="the shared data directory")
    parser.add_argument("--engine", type=int, default=0)
    parser.add_argument("--max-concurrent", type=int, default=64)
    parser.add_argument("--digits", type=int, default=3)
    parser.add_argument("--alphabet", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--min-step-seconds", type=float, default=0.0,
                        help="engine: a decode step lasts at least this long (a slower engine)")
    parser.add_argument("--csv", default=None, help="trainer: the reward-per-step CSV")
    parser.add_argument("--weights", choices=["executor", "file"], default="executor")
    parser.add_argument("--world", type=int, default=0,
                        help="executor: ranks of the gloo world (the trainer and the engines)")
    parser.add_argument("--report", required=True, help="write what this worker did (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    weight_sync = None
    if args.weights == "executor":
        rank = 0 if args.role == "trainer" else 1 + args.engine
        weight_sync = ExecutorSync(rank, args.world, os.path.join(args.data, "dist_store"),
                                   os.path.join(args.data, "plan.json"))
    if args.role == "engine":
        worker = TinyEngine(args.address, args.engine, args.max_concurrent, data=args.data,
                            task=ReverseTask(args.digits, args.alphabet, args.seed),
                            min_step_seconds=args.min_step_seconds, weight_sync=weight_sync)
    else:
        worker = TinyTrainer(args.address, data=args.data, lr=args.lr, epochs=args.epochs,
                             seed=args.seed, csv_path=args.csv, weight_sync=weight_sync)
    try:
        reason = worker.run()
        if args.role == "trainer":
            worker.drain()
    finally:
        report = worker.report()
        report["goodbye"] = worker.goodbye
        write_json_atomic(args.report, report)
    return 0 if reason == "done" and not getattr(worker, "sync_error", None) else 1


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: gloo's threads do not survive the destruction of
    # the process group at exit ("terminate called without an active exception").
    os._exit(status)
