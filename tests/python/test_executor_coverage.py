"""rlsched.weight_sync.executor's coverage check (every destination element written exactly once,
from the plan's slices, before any byte moves) on seeded random instances, against a
per-element count. Pure Python: no torch, no world (the worlds are in
test_executor.py)."""

import itertools
import random

import pytest

from rlsched.weight_sync import executor


def count(shape, boxes):
    """How many times `boxes` write each element of a tensor of `shape` (row-major)."""
    counts = dict.fromkeys(itertools.product(*(range(d) for d in shape)), 0)
    for box in boxes:
        for element in itertools.product(*(range(b, e) for b, e in box)):
            counts[element] += 1
    return counts


def brute_first(shape, boxes):
    """The first element written other than once and its count, or None: one element
    at a time."""
    counts = count(shape, boxes)
    return next(((e, n) for e, n in sorted(counts.items()) if n != 1), None)


def partition(rng, box, pieces):
    """A random partition of `box` into at most `pieces` boxes: guillotine cuts (a random
    dim, a random place), and in some boxes a grid of cuts in one dim (as TP splits)."""
    out = [box]
    while len(out) < pieces:
        i = rng.randrange(len(out))
        b = out[i]
        dims = [d for d, (lo, hi) in enumerate(b) if hi - lo > 1]
        if not dims:
            break
        d = rng.choice(dims)
        cut = rng.randrange(b[d][0] + 1, b[d][1])
        out[i:i + 1] = [b[:d] + ((b[d][0], cut),) + b[d + 1:],
                        b[:d] + ((cut, b[d][1]),) + b[d + 1:]]
    rng.shuffle(out)
    return out


def random_shape(rng):
    return tuple(rng.randint(1, 7) for _ in range(rng.randint(1, 3)))


def full(shape):
    return tuple((0, d) for d in shape)


SEEDS = range(20261206, 20261206 + 300)


@pytest.mark.parametrize("seed", SEEDS[:100])
def test_random_partitions_pass(seed):
    rng = random.Random(seed)
    shape = random_shape(rng)
    boxes = partition(rng, full(shape), rng.randint(1, 12))
    assert executor.first_miscovered(shape, boxes) is None
    assert brute_first(shape, boxes) is None  # the generator makes partitions


@pytest.mark.parametrize("seed", SEEDS[:100])
def test_a_removed_or_duplicated_piece_is_found_at_its_first_element(seed):
    rng = random.Random(seed)
    shape = random_shape(rng)
    boxes = partition(rng, full(shape), rng.randint(1, 12))
    i = rng.randrange(len(boxes))
    piece = boxes[i]
    first = tuple(b for b, _ in piece)
    assert executor.first_miscovered(shape, boxes[:i] + boxes[i + 1:]) == (first, 0)
    assert executor.first_miscovered(shape, boxes + [piece]) == (first, 2)


@pytest.mark.parametrize("seed", SEEDS)
def test_shifted_pieces_and_random_boxes_match_the_per_element_count(seed):
    rng = random.Random(seed)
    shape = random_shape(rng)
    boxes = partition(rng, full(shape), rng.randint(2, 12))
    # One piece moved by one along a dim where it stays inside the tensor.
    i = rng.randrange(len(boxes))
    movable = [(d, s) for d, (b, e) in enumerate(boxes[i]) for s in (-1, 1)
               if 0 <= b + s and e + s <= shape[d]]
    if movable:
        d, s = rng.choice(movable)
        b, e = boxes[i][d]
        boxes[i] = boxes[i][:d] + ((b + s, e + s),) + boxes[i][d + 1:]
        found = executor.first_miscovered(shape, boxes)
        assert found is not None and found == brute_first(shape, boxes)
    # Any boxes at all (gaps, overlaps, empty ones): the same answer as the count.
    boxes = [tuple(tuple(sorted(rng.randint(0, d) for _ in range(2))) for d in shape)
             for _ in range(rng.randint(0, 6))]
    assert executor.first_miscovered(shape, boxes) == brute_first(shape, boxes)


def test_scalars_and_empty_tensors():
    assert executor.first_miscovered((), [()]) is None
    assert executor.first_miscovered((), []) == ((), 0)
    assert executor.first_miscovered((), [(), ()]) == ((), 2)
    assert executor.first_miscovered((0, 4), []) is None


def test_many_slices_take_no_per_element_work():
    # 2048 slices of a 2^16 x 2^40-element tensor: counting its elements would take
    # forever; the corner counts see the one slice missing.
    rows, cols = 1 << 16, 1 << 40
    boxes = [((r, r + 1024), (c, c + (1 << 35))) for r in range(0, rows, 1024)
             for c in range(0, cols, 1 << 35)]
    assert executor.first_miscovered((rows, cols), boxes) is None
    del boxes[1000]
    assert executor.first_miscovered((rows, cols), boxes) == ((31 * 1024, 8 << 35), 0)


class Tensor:
    """What coverage_problems reads of a destination tensor."""

    def __init__(self, *shape):
        self.shape = shape

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


def transfer(index, name, dst_slice, dst_ranks=(2,)):
    return executor.Transfer(index=index, bucket=0, src_rank=0, src_param="w",
                             src_slice=dst_slice, dst_ranks=dst_ranks, dst_param=name,
                             dst_slice=dst_slice, bytes=0)


QKV = "model.layers.0.self_attn.qkv_proj.weight"


def test_problems_name_the_tensor_rank_element_and_transfers():
    dst = {QKV: Tensor(128, 64), "model.norm.weight": Tensor(64)}
    halves = [transfer(4, QKV, ((0, 64), (0, 64))), transfer(9, QKV, ((64, 128), (0, 64))),
              transfer(11, "model.norm.weight", ((0, 64),), dst_ranks=(2, 3))]
    assert executor.coverage_problems(2, halves, dst) == []
    # Rank 3 receives the norm only: qkv_proj is not written at all there.
    assert executor.coverage_problems(3, halves, dst) == [
        (3, "dst_slice", f"element [0, 0] of '{QKV}' (shape [128, 64]) is written by no "
                         "transfer (0 transfer(s) write into it: a transfer missing or "
                         "re-addressed)")]
    overlap = halves[:1] + [transfer(9, QKV, ((63, 127), (0, 64)))] + halves[2:]
    (problem,) = executor.coverage_problems(2, overlap, dst)
    assert problem == (2, "dst_slice", f"element [63, 0] of '{QKV}' (shape [128, 64]) is "
                                       "written 2 times, by transfers [4, 9]")
    # Without destination tensors (an on_slice callback): the span of the slices.
    assert executor.coverage_problems(2, halves, None) == []
    assert executor.coverage_problems(2, overlap, None)[0][2] == (
        f"element [63, 0] of '{QKV}' (its slices span [0:127, 0:64]) is written 2 times, "
        "by transfers [4, 9]")
    gap = [halves[0], transfer(9, QKV, ((65, 128), (0, 64)))]
    assert "element [64, 0]" in executor.coverage_problems(2, gap, None)[0][2]


def test_fp8_scales_are_not_written_by_slices():
    name = "model.layers.0.mlp.down_proj.weight"
    dst = {name: Tensor(128, 128), executor.scale_name(name): Tensor(1, 1)}
    assert executor.coverage_problems(2, [transfer(0, name, ((0, 128), (0, 128)))], dst) == []


@pytest.mark.parametrize("name", ["lm_head.weight", "model.embed_tokens.weight"])
def test_vocabulary_padding_may_stay_unwritten(name):
    # vLLM pads the vocabulary to a multiple of 64 rows: the last rows of a rank's shard.
    dst = {name: Tensor(160, 8)}
    written = [transfer(0, name, ((0, 60), (0, 8))), transfer(1, name, ((60, 97), (0, 8)))]
    assert executor.coverage_problems(2, written, dst) == []  # 63 rows of padding
    # More trailing rows than padding: a slice missing (or cut short).
    short = written[:1] + [transfer(1, name, ((60, 96), (0, 8)))]
    assert executor.coverage_problems(2, short, dst)[0][2].startswith(
        f"element [96, 0] of '{name}' (shape [160, 8]) is written by no transfer")
    assert "element [60, 0]" in executor.coverage_problems(2, written[:1], dst)[0][2]
    # A gap before the last rows written is never padding.
    gap = [written[0], transfer(1, name, ((61, 97), (0, 8)))]
    assert "element [60, 0]" in executor.coverage_problems(2, gap, dst)[0][2]
    # Other tensors have no padding.
    other = {"model.norm.weight": Tensor(160)}
    assert executor.coverage_problems(2, [transfer(0, "model.norm.weight", ((0, 159),))],
                                      other)[0][2].startswith("element [159]")
