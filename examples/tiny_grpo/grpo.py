"""GRPO on the tiny model: sampling with a KV cache, group-normalised advantages and the
clipped policy-gradient loss on the engine's logprobs (no reference model, no KL term).

:class:`Rollout` is one sample being generated; :func:`decode_step` advances a set of
them by one token each, batching the rows of equal context length (fresh rows are
prefilled, the others feed their last token against their KV cache). The engine
workers and :func:`train_in_process` use the same code.
"""

import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from task import EOS

PAD = 13


class Rollout:
    """A sample: its prompt, the response so far with the engine's logprob of each token
    and the weights version that generated it, and the KV cache of its context (None
    when it must be prefilled: fresh, or resumed after a weight update)."""

    __slots__ = ("sample", "group", "prompt_id", "prompt", "response", "logprobs",
                 "versions", "cache", "generator", "max_new", "paused")

    def __init__(self, sample: int, group: int, prompt_id: int, prompt: List[int],
                 max_new: int, seed: int):
        self.sample, self.group, self.prompt_id = sample, group, prompt_id
        self.prompt = list(prompt)
        self.response: List[int] = []
        self.logprobs: List[float] = []
        self.versions: List[int] = []
        self.cache = None
        self.generator = torch.Generator().manual_seed(seed)
        self.max_new = max_new
        self.paused = False

    @property
    def done(self) -> bool:
        return len(self.response) >= self.max_new or (self.response and self.response[-1] == EOS)


def sample_seed(seed: int, sample: int, attempt: int = 0) -> int:
    """A sample's sampling seed: a function of the run's seed, the sample id and the
    tokens it resumes from."""
    return (seed * 0x9E3779B1 + sample * 0x85EBCA77 + attempt * 0xC2B2AE3D) % (1 << 63)


@torch.no_grad()
def decode_step(model, rollouts: Sequence[Rollout], version: int,
                temperature: float = 1.0) -> None:
    """Gives every rollout (not done, not paused) one more token."""
    by_kind: Dict[tuple, List[Rollout]] = {}
    for r in rollouts:
        if r.paused or r.done:
            continue
        key = (r.cache is None, len(r.prompt) + len(r.response))
        by_kind.setdefault(key, []).append(r)
    for (fresh, _), rows in sorted(by_kind.items()):
        if fresh:
            ids = torch.tensor([r.prompt + r.response for r in rows])
            logits, cache = model(ids)
        else:
            ids = torch.tensor([[r.response[-1]] for r in rows])
            past = [(torch.cat([r.cache[i][0] for r in rows]),
                     torch.cat([r.cache[i][1] for r in rows]))
                    for i in range(len(rows[0].cache))]
            logits, cache = model(ids, past)
        logp = F.log_softmax(logits[:, -1].float() / temperature, dim=-1)
        probs = logp.exp()
        for j, r in enumerate(rows):
            token = int(torch.multinomial(probs[j], 1, generator=r.generator))
            r.response.append(token)
            r.logprobs.append(float(logp[j, token]))
            r.versions.append(version)
            r.cache = [(k[j:j + 1], v[j:j + 1]) for k, v in cache]


def group_advantages(rewards: Sequence[float]) -> List[float]:
    """GRPO: (r - mean) / (std + 1e-6) within the group (population std); 0 for a group
    whose rewards are all equal."""
    t = torch.tensor(rewards, dtype=torch.float64)
    std = t.std(unbiased=False)
    return ((t - t.mean()) / (std + 1e-6)).tolist()


def process_advantages(position_rewards: Sequence[Sequence[float]],
                       lengths: Sequence[int]) -> List[List[float]]:
    """GRPO with process supervision (after DeepSeekMath, section 4.1.3): the reward
    earned at each scored position is normalised within the group, and a token's
    advantage is the sum of the normalised rewards at its position and after it (a
    token cannot change what was earned before it); tokens past the scored positions
    get 0.

    Unlike DeepSeekMath, which normalises by the mean and std of all the group's
    rewards at once, each position is normalised by the mean and (population) std of
    that position's rewards across the group: every position's term then has zero mean
    within the group, and a position that every sample got right (or wrong) adds 0.
    Pooled, such a position adds the same positive (or negative) amount to every earlier
    token's advantage, which raises (or lowers) the probability of whatever was sampled
    there: the policy sharpens on its current guesses, right or wrong, and the group
    stops varying (measured: the policy then stuck, confidently wrong, on the middle
    position of half the prompts, and the mean reward at 0.7-0.8)."""
    width = max(len(rs) for rs in position_rewards)
    table = torch.tensor([list(rs) + [0.0] * (width - len(rs)) for rs in position_rewards],
                         dtype=torch.float64)
    mean, std = table.mean(0), table.std(0, unbiased=False)
    norm = (table - mean) / (std + 1e-6)
    to_go = norm.flip(1).cumsum(1).flip(1).tolist()
    return [[to_go[s][i] if i < width else 0.0 for i in range(n)]
            for s, n in enumerate(lengths)]


ADVANTAGES = ("outcome", "process")


def advantages(kind: str, rewards: Sequence[float],
               position_rewards: Sequence[Sequence[float]], lengths: Sequence[int]) -> list:
    """A group's advantages: ``outcome`` one per sample (:func:`group_advantages` of
    the rewards), ``process`` one per token (:func:`process_advantages`)."""
    if kind == "outcome":
        return group_advantages(rewards)
    if kind == "process":
        return process_advantages(position_rewards, lengths)
    raise ValueError(f"advantage must be one of {', '.join(ADVANTAGES)}, got {kind!r}")


def policy_loss(model, batch: Sequence[dict], clip: float = 0.2, entropy_coef: float = 0.0,
                clip_high: Optional[float] = None):
    """The summed clipped surrogate loss of a micro-batch and its response tokens.

    Each item has ``prompt``, ``response``, ``logprobs`` (the engine's, per response
    token) and ``advantage`` (one for every token, or a list: one per response
    token). Loss per token: -min(ρ·A, clip(ρ, 1 ± clip)·A) with
    ρ = exp(logπ_new - logπ_engine) (``clip_high``: the upper bound 1 + clip_high
    instead, DAPO's "clip-higher": a rare token with a positive advantage may then grow
    faster than 1 + clip per batch), minus ``entropy_coef`` times the entropy of the
    policy's next-token distribution there (a bonus that keeps it exploring)."""
    width = max(len(b["prompt"]) + len(b["response"]) for b in batch)
    ids = torch.full((len(batch), width), PAD, dtype=torch.long)
    mask = torch.zeros(len(batch), width - 1)
    old = torch.zeros(len(batch), width - 1)
    adv = torch.zeros(len(batch), width - 1)
    for i, b in enumerate(batch):
        seq = b["prompt"] + b["response"]
        ids[i, :len(seq)] = torch.tensor(seq)
        start = len(b["prompt"]) - 1  # logits at position t predict token t + 1
        n = len(b["response"])
        mask[i, start:start + n] = 1.0
        old[i, start:start + n] = torch.tensor(b["logprobs"], dtype=torch.float32)
        a = b["advantage"]
        adv[i, start:start + n] = (torch.tensor(a, dtype=torch.float32)
                                   if isinstance(a, (list, tuple)) else float(a))
    logits, _ = model(ids)
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    new = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(new - old)
    high = clip if clip_high is None else clip_high
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + high) * adv)
    if entropy_coef:
        entropy = -(logp.exp() * logp).sum(-1)
        surrogate = surrogate + entropy_coef * entropy
    return -(surrogate * mask).sum(), int(mask.sum())


def train_in_process(task, model, steps: int, prompts_per_step: int, samples_per_prompt: int,
                     seed: int = 0, lr: float = 3e-3, epochs: int = 1,
                     max_grad_norm: float = 0.0, entropy_coef: float = 0.0,
                     advantage: str = "outcome", lr_end: Optional[float] = None,
                     clip_high: Optional[float] = None, log=None) -> List[float]:
    """GRPO in one process (generate, then train, one optimizer step per batch): the
    mean reward of each step's samples, generated before the step's update."""
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    curve = []
    for step in range(steps):
        set_lr(optimizer, lr_at(step, steps, lr, lr_end))
        t0 = time.monotonic()
        rollouts = []
        for p in range(prompts_per_step):
            prompt_id = step * prompts_per_step + p
            for i in range(samples_per_prompt):
                sample = prompt_id * samples_per_prompt + i
                rollouts.append(Rollout(sample, prompt_id, prompt_id, task.prompt(prompt_id),
                                        task.max_new_tokens, sample_seed(seed, sample)))
        model.eval()
        while any(not r.done for r in rollouts):
            decode_step(model, rollouts, step)
        batch = []
        rewards = []
        for g in range(prompts_per_step):
            rows = rollouts[g * samples_per_prompt:(g + 1) * samples_per_prompt]
            rs = [task.reward(r.prompt_id, r.response) for r in rows]
            rewards.extend(rs)
            for r, a in zip(rows, advantages(
                    advantage, rs, [task.position_rewards(r.prompt_id, r.response)
                                    for r in rows], [len(r.response) for r in rows])):
                batch.append({"prompt": r.prompt, "response": r.response,
                              "logprobs": r.logprobs, "advantage": a})
        model.train()
        for _ in range(epochs):
            optimizer.zero_grad()
            loss, tokens = policy_loss(model, batch, entropy_coef=entropy_coef,
                                       clip_high=clip_high)
            (loss / tokens).backward()
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
        curve.append(sum(rewards) / len(rewards))
        if log:
            log(f"step {step:3d} reward {curve[-1]:.3f} ({time.monotonic() - t0:.2f} s)")
    return curve


def lr_at(step: int, steps: int, lr: float, lr_end: Optional[float]) -> float:
    """The learning rate of train step `step` of `steps`: `lr`, or with `lr_end` going
    linearly from `lr` at step 0 to `lr_end` at the last step."""
    if lr_end is None or steps <= 1:
        return lr
    return lr + (lr_end - lr) * min(step, steps - 1) / (steps - 1)


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def make_optimizer(model, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    from model import load_model
    from task import OPERATIONS, DigitTask

    parser = argparse.ArgumentParser(description="GRPO on the reverse task in one process")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--task", choices=OPERATIONS, default="add",
                        help="add one to each digit (default) or reverse the digits")
    parser.add_argument("--digits", type=int, default=3)
    parser.add_argument("--alphabet", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-end", type=float, default=None)
    parser.add_argument("--advantage", choices=ADVANTAGES, default="process")
    parser.add_argument("--entropy-coef", type=float, default=0.0)
    parser.add_argument("--clip-high", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = DigitTask(args.task, args.digits, args.alphabet, args.seed)
    model = load_model(seed=args.seed)
    train_in_process(task, model, args.steps, args.prompts, args.group, args.seed, args.lr,
                     args.epochs, args.max_grad_norm, args.entropy_coef, args.advantage,
                     args.lr_end, args.clip_high, log=print)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
