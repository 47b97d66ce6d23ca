"""The task: a short digit string transformed; the reward is verifiable.

Tokens: the digits 0..9 are tokens 0..9; BOS = 10, SEP = 11, EOS = 12 (13..15 unused,
the vocabulary is the config's 16). A prompt is ``BOS d1 .. dn SEP``; the right
response is, by the task's operation, ``add``: ``(d1 + 1) .. (dn + 1) EOS`` modulo the
alphabet (the default), or ``reverse``: ``dn .. d1 EOS``. Reversal is the harder one for
this model: output position i must look back 2i + 1 tokens, a different offset per
position, and GRPO from scratch settles near 0.8 (the middle digit copied from an end);
``add`` looks back a fixed n + 1 tokens and maps each digit. The digits of prompt ``p``
are drawn from ``random.Random(seed * 1_000_003 + p)`` (deterministic across runs and
processes), each in ``[0, alphabet)``. The reward of a response is the fraction of the n
positions whose token is right (a response cut short, or ended early by EOS, is wrong at
the missing positions; what follows the n-th token is not scored).
"""

import random
from typing import List, Sequence

BOS, SEP, EOS = 10, 11, 12


OPERATIONS = ("add", "reverse")


class DigitTask:
    def __init__(self, operation: str = "add", digits: int = 3, alphabet: int = 10,
                 seed: int = 0):
        if operation not in OPERATIONS:
            raise ValueError(f"task operation must be one of {OPERATIONS}, got {operation!r}")
        if not 1 <= digits <= 12:
            raise ValueError(f"task digits must be in [1, 12], got {digits}")
        if not 2 <= alphabet <= 10:
            raise ValueError(f"task alphabet must be in [2, 10], got {alphabet}")
        self.operation = operation
        self.digits = digits
        self.alphabet = alphabet
        self.seed = seed

    @property
    def prompt_tokens(self) -> int:
        return self.digits + 2

    @property
    def max_new_tokens(self) -> int:
        """The n digits and EOS."""
        return self.digits + 1

    def digits_of(self, prompt: int) -> List[int]:
        rng = random.Random(self.seed * 1_000_003 + prompt)
        return [rng.randrange(self.alphabet) for _ in range(self.digits)]

    def prompt(self, prompt: int) -> List[int]:
        return [BOS, *self.digits_of(prompt), SEP]

    def target(self, prompt: int) -> List[int]:
        digits = self.digits_of(prompt)
        if self.operation == "reverse":
            return list(reversed(digits))
        return [(d + 1) % self.alphabet for d in digits]

    def position_rewards(self, prompt: int, response: Sequence[int]) -> List[float]:
        """The reward earned at each of the n scored positions: 1/n where the token is
        right, else 0 (they add up to :meth:`reward`)."""
        target = self.target(prompt)
        return [1.0 / len(target) if i < len(response) and response[i] == t else 0.0
                for i, t in enumerate(target)]

    def reward(self, prompt: int, response: Sequence[int]) -> float:
        return sum(self.position_rewards(prompt, response))
