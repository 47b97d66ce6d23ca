"""The task: reverse a short digit string; the reward is verifiable.

Tokens: the digits 0..9 are tokens 0..9; BOS = 10, SEP = 11, EOS = 12 (13..15 unused,
the vocabulary is the config's 16). A prompt is ``BOS d1 .. dn SEP``; the right
response is ``dn .. d1 EOS``. The digits of prompt ``p`` are drawn from
``random.Random(seed * 1_000_003 + p)`` (deterministic across runs and processes), each
in ``[0, alphabet)``. The reward of a response is the fraction of the n positions whose
token is right (a response cut short, or ended early by EOS, is wrong at the missing
positions; what follows the n-th token is not scored).
"""

import random
from typing import List, Sequence

BOS, SEP, EOS = 10, 11, 12


class ReverseTask:
    def __init__(self, digits: int = 3, alphabet: int = 10, seed: int = 0):
        if not 1 <= digits <= 12:
            raise ValueError(f"task digits must be in [1, 12], got {digits}")
        if not 2 <= alphabet <= 10:
            raise ValueError(f"task alphabet must be in [2, 10], got {alphabet}")
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
        return list(reversed(self.digits_of(prompt)))

    def position_rewards(self, prompt: int, response: Sequence[int]) -> List[float]:
        """The reward earned at each of the n scored positions: 1/n where the token is
        right, else 0 (they add up to :meth:`reward`)."""
        target = self.target(prompt)
        return [1.0 / len(target) if i < len(response) and response[i] == t else 0.0
                for i, t in enumerate(target)]

    def reward(self, prompt: int, response: Sequence[int]) -> float:
        return sum(self.position_rewards(prompt, response))
