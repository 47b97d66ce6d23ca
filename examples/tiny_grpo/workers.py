"""The tiny GRPO run's workers: engines that sample the tiny model with a KV cache and a
trainer that trains it with GRPO, attached to ``rlsched run`` over gRPC.

The control plane (rlsched) carries ids and counts only. The data plane is a shared
directory (``--data DIR``):

- ``samples/<sample>.json``: one file per finished sample, written atomically by the
  engine that finished it (prompt and response tokens, the engine's logprob and weights
  version of every response token, the reward), read by the trainer when a StartTrain
  lists the sample;
- ``finished.engine<e>``: the ids of the samples engine e finished, appended as they
  finish (its own count, which a SIGKILL leaves);
- ``alive/engine<e>.lock``: flocked by engine e while it lives;
- ``partial/<sample>.json``: the tokens of a sample an interrupting SyncWeights paused
  (partial rollout), so that it can be resumed from them;
- ``weights/v0.pt``: the initial policy (a state dict with the HF Llama names, written
  by run.py before anything starts), which the trainer loads.

Weights move one of two ways (``--weights``):

- ``executor`` (default): rlsched's executor over ``torch.distributed`` gloo. The trainer
  is rank 0 and engine e is rank 1 + e of one world (a FileStore under the data
  directory); every rank runs the plan ``rlsched reshard --train tp=1 --infer
  tp=1,replicas=E --plan-out plan_E.json`` gives (run.py makes it, and one for each
  smaller membership: a dead engine's rank leaves the world, see
  :class:`ExecutorSync`). The trainer hands its
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
import gc
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

from grpo import (ADVANTAGES, Rollout, advantages, decode_step, lr_at, policy_loss,  # noqa: E402
                  sample_seed, set_lr)
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


def plan_path(data: str, engines: int) -> str:
    """The resharding plan of a world of the trainer and `engines` engines (TP 1 each)."""
    return os.path.join(data, f"plan_{engines}.json")


def alive_path(data: str, engine: int) -> str:
    return os.path.join(data, "alive", f"engine{engine}.lock")


def hold_alive_lock(data: str, engine: int):
    """An engine holds an exclusive flock on its file while it lives: the kernel lets
    go of it when the process ends, however it ends (SIGKILL too)."""
    import fcntl
    f = open(alive_path(data, engine), "a")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return f


def engine_alive(data: str, engine: int) -> bool:
    """Whether engine `engine` still holds its lock (tried without waiting)."""
    import fcntl
    with open(alive_path(data, engine), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


class ExecutorSync:
    """One rank's side of the weight sync over rlsched's executor (gloo): rank 0 the
    trainer (TP 1), ranks 1..M the M engines of the current membership (TP 1 each, in
    the order of their ids).

    Membership epochs: epoch 0 holds every engine. When a collective fails (an engine
    died: gloo's connections to it close), the world is rebuilt without it. The
    trainer leaves the old world, keeps the engines that still hold their alive lock
    (see :func:`hold_alive_lock`) and announces epoch k + 1 with them
    (``epochs/<k+1>.json``); an engine whose collective failed asks for it
    (``epochs/<k+1>.request.engine<e>``, for a trainer that saw no failure) and, like
    any member that finds the announcement before its next receive, leaves the old
    world and joins the new one: a new gloo world on a new FileStore
    (``dist_store.<k+1>``), the plan for M engines (``plan_<M>.json``, run.py makes one
    per M), a new :class:`rlsched.executor.Executor` (its checks, its groups). Then the
    members exchange the last version each engine received, and the trainer sends again
    every version from the oldest any member lacks (an engine that has one already
    receives it and keeps what it had). The executor itself is unchanged: a world is
    built once per membership.
    """

    def __init__(self, data: str, engines: int, engine: Optional[int] = None,
                 timeout_seconds: float = 120.0):
        import datetime

        from rlsched import executor
        from rlsched import executor_layouts as lay

        self.lay, self.executor_module = lay, executor
        self.data = data
        self.engine = engine  # None: the trainer
        self.timeout = datetime.timedelta(seconds=timeout_seconds)
        with open(CONFIG_PATH) as f:
            self.layout = lay.parse_config(f.read())
        self.config = Config.load(CONFIG_PATH)
        self.members = list(range(engines))
        self.epoch = 0
        self.epochs: List[dict] = []  # per epoch: its members, when it was made
        os.makedirs(os.path.join(data, "epochs"), exist_ok=True)
        self.runs = 0
        self.bytes = 0
        self.seconds = 0.0
        # Trainer: every version it was handed, to send again after a rebuild.
        self.history: Dict[int, Dict[str, torch.Tensor]] = {}
        self.next_version = 0  # trainer: the next version to send
        self.incoming = 0  # engine: the version the next run carries
        self.received = -1  # engine: the newest version received
        self.state: Optional[Dict[str, torch.Tensor]] = None  # engine: that version
        self._join()

    @property
    def rank(self) -> int:
        return 0 if self.engine is None else 1 + self.members.index(self.engine)

    def _join(self) -> None:
        """Builds the world of the current epoch and its executor (collective)."""
        import torch.distributed as dist

        lay, world = self.lay, 1 + len(self.members)
        store = dist.FileStore(os.path.join(self.data, f"dist_store.{self.epoch}"), world)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=world,
                                timeout=self.timeout)
        infer = lay.Infer(tp=1, replicas=len(self.members))
        zeros = {name: torch.zeros(shape, dtype=dtype)
                 for name, (shape, dtype) in lay.hf_shapes(self.layout).items()}
        self.sources, self.destinations = None, None
        if self.engine is None:
            self.sources = lay.megatron_shards(self.layout, lay.Train(), 0, zeros)
        else:
            self.destinations = {k: torch.zeros_like(v) for k, v in
                                 lay.vllm_shards(self.layout, infer, 0, zeros).items()}
        ex = self.executor_module
        # Collective: every rank checks the plan against this world's layouts and its
        # tensors before any byte moves.
        self.executor = ex.Executor(
            ex.load_plan(plan_path(self.data, len(self.members)), self.rank),
            sources=self.sources, destinations=self.destinations, timeout=self.timeout,
            layout=ex.world_layout(lay.Train(), infer))
        # Which versions each member holds (the trainer sends again from the oldest
        # one missing).
        held: List[Optional[int]] = [None] * world
        dist.all_gather_object(held, self.received)
        start = min(held[1:]) + 1
        if self.engine is None:
            # Every member holds the versions before `start` (the engines receive in
            # order): those the trainer keeps no longer.
            self.next_version = start
            for v in [v for v in self.history if v < start]:
                del self.history[v]
        else:
            self.incoming = start
        self.epochs.append({"epoch": self.epoch, "members": list(self.members),
                            "resend_from": start, "time": time.time()})

    def _announced(self) -> Optional[List[int]]:
        path = os.path.join(self.data, "epochs", f"{self.epoch + 1}.json")
        try:
            with open(path) as f:
                return json.load(f)["members"]
        except FileNotFoundError:
            return None

    def _requested(self) -> bool:
        prefix = f"{self.epoch + 1}.request."
        return any(n.startswith(prefix) for n in os.listdir(os.path.join(self.data, "epochs")))

    def _rebuild(self, reason: str) -> None:
        """Leaves this epoch's world and joins the next one's."""
        import torch.distributed as dist

        print(f"{'trainer' if self.engine is None else f'engine{self.engine}'}: weight "
              f"sync epoch {self.epoch} ends ({reason})", file=sys.stderr, flush=True)
        # Every reference to the old world's process groups goes (the executor's groups,
        # a failed collective's work), so that its connections close now: a member still
        # waiting in a collective of the old world fails at once instead of at its
        # timeout.
        self.executor = None
        try:
            dist.destroy_process_group()
        except Exception:  # a broken world: what is left of it goes with the process
            pass
        gc.collect()
        if self.engine is None:
            members = [e for e in self.members if engine_alive(self.data, e)]
            if not members:
                raise RuntimeError("weight sync: no engine left alive")
            write_json_atomic(os.path.join(self.data, "epochs", f"{self.epoch + 1}.json"),
                              {"members": members})
        else:
            write_json_atomic(os.path.join(self.data, "epochs",
                                           f"{self.epoch + 1}.request.engine{self.engine}"),
                              {"reason": reason})
            deadline = time.monotonic() + self.timeout.total_seconds()
            while (members := self._announced()) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weight sync: epoch {self.epoch + 1} not announced "
                                       f"within {self.timeout}")
                time.sleep(0.01)
            if self.engine not in members:
                raise RuntimeError(f"weight sync: engine {self.engine} left out of epoch "
                                   f"{self.epoch + 1}")
        self.epoch += 1
        self.members = members
        self._join()

    def pending(self) -> bool:
        """Trainer: whether a version it was handed has not been sent yet."""
        return self.next_version in self.history

    def poll(self) -> None:
        """Trainer, between sends: rebuilds when an engine asked for it."""
        if self._requested():
            self._rebuild("an engine asked for a new world")

    def send(self, version: int, state) -> None:
        """Trainer: keeps `version` (an HF-named state) and sends every version not sent
        yet, in order, each in the Megatron layout and one run of the plan."""
        self.history[version] = state
        while self.pending():
            if self._requested():
                self._rebuild("an engine asked for a new world")
                continue
            fresh = self.lay.megatron_shards(self.layout, self.lay.Train(), 0,
                                             self.history[self.next_version])
            with torch.no_grad():
                for name, tensor in fresh.items():
                    self.sources[name].copy_(tensor)
            failure = self._try_run()
            if failure:
                self._rebuild(failure)
                continue
            self.next_version += 1
            # Run v completed here: every member finished run v - 1 before it took part
            # in run v, so no rebuild asks for an older version again.
            self.history.pop(self.next_version - 2, None)

    def receive(self, version: int) -> Dict[str, torch.Tensor]:
        """Engine: runs the plan until it holds `version`; its HF-named tensors."""
        while self.received < version:
            if self._announced() is not None:
                self._rebuild("the trainer announced a new world")
                continue
            failure = self._try_run()
            if failure:
                self._rebuild(failure)
                continue
            v, self.incoming = self.incoming, self.incoming + 1
            if v > self.received:
                self.received, self.state = v, self._hf_state()
        return self.state

    def _hf_state(self) -> Dict[str, torch.Tensor]:
        """The received vLLM tensors as HF-named ones."""
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

    def _try_run(self) -> Optional[str]:
        """One run of the plan; what failed, or None. (The exception, which holds the
        failed collective and its process group, is gone when this returns.)"""
        try:
            self._run()
            return None
        except RuntimeError as e:
            return f"{type(e).__name__}: {e}".splitlines()[0][:200]

    def _run(self) -> None:
        stats = self.executor.run()
        self.runs += 1
        self.bytes += stats.bytes_sent + stats.bytes_received
        self.seconds += stats.transfer_seconds

    def report(self) -> dict:
        return {"runs": self.runs, "bytes": self.bytes, "seconds": round(self.seconds, 6),
                "epochs": self.epochs}


class TinyEngine(EngineWorker):
    """Continuous batching over the running samples (one decode step gives each one a
    token; rows of equal context length run as one batch), a KV cache per sample that a
    weight update invalidates (the prefix is prefilled again on resume)."""

    def __init__(self, address: str, engine: int, max_concurrent: int, *, data: str,
                 task: ReverseTask, min_step_seconds: float = 0.0,
                 weight_sync: Optional[ExecutorSync] = None, stall_at_version: int = -1,
                 **kwargs):
        super().__init__(address, engine, max_concurrent, **kwargs)
        self.data = data
        # A test hook for killing an engine mid-generation: after its first decode step
        # under this version or a later one it writes stalled.engine<e> and generates no
        # more (it still takes commands), so that the SIGKILL run.py then sends finds it
        # with samples half generated. -1: never.
        self.stall_at_version = stall_at_version
        self.stalled = False
        # Every finished sample's id, appended as it finishes: the engine's own count,
        # which outlives a SIGKILL.
        self._finished_log = open(os.path.join(data, f"finished.engine{engine}"), "a")
        self.weight_sync = weight_sync
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
                if sync.version <= self.weight_sync.received:
                    self._fail(f"SyncWeights to version {sync.version}, but version "
                               f"{self.weight_sync.received} was received already")
                self.model.load_state_dict(self.weight_sync.receive(sync.version))
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
                if self.stalled:
                    self._lock.wait(timeout=0.5)
                    continue
                start = time.monotonic()
                decode_step(self.model, active, self.version)
                if 0 <= self.stall_at_version <= self.version:
                    self.stalled = True
                    write_json_atomic(os.path.join(self.data, f"stalled.engine{self.engine}"),
                                      {"version": self.version, "running": len(self._running),
                                       "tokens": sum(len(r.response)
                                                     for r in self._running.values())})
                    continue
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
            "versions": r.versions, "reward": reward,
            "position_rewards": self.task.position_rewards(r.prompt_id, r.response),
            "engine": self.engine})
        self.finished_samples.append(r.sample)
        self._finished_log.write(f"{r.sample}\n")
        self._finished_log.flush()
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
                 advantage: str = "outcome", max_grad_norm: float = 0.0,
                 entropy_coef: float = 0.0, lr_end: Optional[float] = None,
                 clip_high: Optional[float] = None, **kwargs):
        super().__init__(address, **kwargs)
        self.clip_high = clip_high
        self.lr, self.lr_end = lr, lr_end
        self.advantage = advantage
        self.max_grad_norm = max_grad_norm
        self.entropy_coef = entropy_coef
        self.data = data
        self.weight_sync = weight_sync
        self.sync_error: Optional[str] = None
        self.epochs = epochs
        torch.manual_seed(seed)
        self.model = TinyLlama(Config.load(CONFIG_PATH))
        load_weights(data, 0, self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.trained: List[int] = []
        self.trained_by_engine: Dict[str, int] = {}  # engine id -> samples trained
        self.published: Dict[int, str] = {0: weights_digest(self.model.state_dict())}
        if weight_sync is not None:
            # The sync thread sends every version in order (version 0 first).
            self._versions: "queue.Queue" = queue.Queue()
            self._sending = threading.Condition()
            self._queued, self._sent = 1, 0
            self._versions.put((0, self._snapshot()))
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
        self.total_steps = config.steps

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
            for s, a in zip(rows, advantages(self.advantage, [s["reward"] for s in rows],
                                             [s["position_rewards"] for s in rows],
                                             [len(s["response"]) for s in rows])):
                s["advantage"] = a
        tokens = sum(len(s["response"]) for s in items)
        plan = [[list(mb.indices) for mb in rank.micro_batches] for rank in call.plan.ranks]
        if not plan:
            plan = [[list(range(len(items)))]]
        micro_batches = sum(1 for rank in plan for mb in rank if mb)
        self.model.train()
        set_lr(self.optimizer, lr_at(call.step, self.total_steps, self.lr, self.lr_end))
        for _ in range(self.epochs):
            self.optimizer.zero_grad()
            for rank in plan:
                for mb in rank:
                    if mb:
                        loss, _ = policy_loss(self.model, [items[i] for i in mb],
                                              entropy_coef=self.entropy_coef,
                                              clip_high=self.clip_high)
                        # A token mean over the whole call, whatever the split.
                        (loss / tokens).backward()
            if self.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.optimizer.step()
        self.trained.extend(call.samples)
        for s in items:
            key = str(s["engine"])
            self.trained_by_engine[key] = self.trained_by_engine.get(key, 0) + 1
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
                self._versions.put((call.step + 1, snapshot))
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
                try:
                    version, snapshot = self._versions.get(timeout=0.2)
                except queue.Empty:
                    self.weight_sync.poll()  # an engine may ask for a new world
                    continue
                self.weight_sync.send(version, snapshot)
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
        return {"trained": self.trained, "trained_by_engine": self.trained_by_engine,
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
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--advantage", choices=ADVANTAGES, default="process")
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--clip-high", type=float, default=None)
    parser.add_argument("--lr-end", type=float, default=None)
    parser.add_argument("--entropy-coef", type=float, default=0.0)
    parser.add_argument("--min-step-seconds", type=float, default=0.0,
                        help="engine: a decode step lasts at least this long (a slower engine)")
    parser.add_argument("--stall-at-version", type=int, default=-1,
                        help="engine: stop generating after the first decode step under "
                        "this version and write stalled.engine<e> (run.py then kills it)")
    parser.add_argument("--csv", default=None, help="trainer: the reward-per-step CSV")
    parser.add_argument("--weights", choices=["executor", "file"], default="executor")
    parser.add_argument("--engines", type=int, default=1,
                        help="executor: the engines of the run (the weight-sync world holds "
                        "the trainer and those alive)")
    parser.add_argument("--report", required=True, help="write what this worker did (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    weight_sync = None
    if args.weights == "executor":
        if args.role == "engine":
            alive = hold_alive_lock(args.data, args.engine)  # noqa: F841 (held until exit)
        weight_sync = ExecutorSync(args.data, args.engines,
                                   None if args.role == "trainer" else args.engine)
    if args.role == "engine":
        worker = TinyEngine(args.address, args.engine, args.max_concurrent, data=args.data,
                            task=ReverseTask(args.digits, args.alphabet, args.seed),
                            min_step_seconds=args.min_step_seconds, weight_sync=weight_sync,
                            stall_at_version=args.stall_at_version)
    else:
        worker = TinyTrainer(args.address, data=args.data, lr=args.lr, epochs=args.epochs,
                             seed=args.seed, csv_path=args.csv, weight_sync=weight_sync,
                             advantage=args.advantage, max_grad_norm=args.max_grad_norm,
                             entropy_coef=args.entropy_coef, lr_end=args.lr_end,
                             clip_high=args.clip_high)
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
