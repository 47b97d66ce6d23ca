"""The native module rlsched._native against the daemon: the same seeded random inputs
through both give the same results (balance, plan_step, get_seqlen_balanced_partitions,
plan_micro_batches), numpy arrays and lists alike, and bad input is a ValueError that
names the field. Skipped when the module was not built (RLSCHED_BUILD_PYTHON=OFF, no
pybind11, or a sanitizer build)."""

import random
import threading

import pytest

import rlsched
from rlsched import client as client_module

pytestmark = pytest.mark.skipif(
    not rlsched.native_available(),
    reason="rlsched._native is not built (RLSCHED_BUILD_PYTHON=OFF, pybind11 missing, or a "
           "sanitizer/fuzzer build): the in-process tests are skipped")

np = pytest.importorskip("numpy") if rlsched.native_available() else None


def _lengths(rng, n, low=1, high=32768):
    return [rng.randint(low, high) for _ in range(n)]


BALANCE_CASES = [
    # (seed, n, k, equal_size)
    (1, 10, 3, False),
    (2, 64, 8, True),
    (3, 1000, 16, False),
    (4, 4096, 32, True),
    (5, 5, 8, False),  # fewer sequences than parts
]


@pytest.mark.parametrize("seed,n,k,equal_size", BALANCE_CASES)
def test_balance_same_as_daemon(client, seed, n, k, equal_size):
    lengths = _lengths(random.Random(seed), n)
    daemon = client.balance(lengths, k, equal_size=equal_size)
    native = client_module.native_balance(lengths, k, equal_size=equal_size)
    assert native == daemon
    assert client_module.native_balance(np.asarray(lengths, dtype=np.int64), k,
                                        equal_size=equal_size) == daemon


def test_balance_groups_and_options_same_as_daemon(client):
    rng = random.Random(7)
    lengths = _lengths(rng, 512)
    groups = [i // 8 for i in range(512)]
    for kwargs in ({"keep_groups": True}, {"keep_groups": True, "equal_size": True},
                   {"algorithm": "greedy"}, {"refine_iterations": 0},
                   {"algorithm": "ALGORITHM_KARMARKAR_KARP", "refine_iterations": 5}):
        daemon = client.balance(lengths, 8, groups=groups, **kwargs)
        native = client_module.native_balance(lengths, 8, groups=groups, **kwargs)
        assert native == daemon, kwargs


@pytest.mark.parametrize("seed,n,k,equal_size", BALANCE_CASES[:4])
def test_get_seqlen_balanced_partitions_same_as_daemon(client, seed, n, k, equal_size):
    lengths = _lengths(random.Random(seed), n)
    daemon = client.get_seqlen_balanced_partitions(lengths, k, equal_size)
    assert client_module.native_get_seqlen_balanced_partitions(lengths, k, equal_size) == daemon
    array = np.asarray(lengths, dtype=np.int64)
    assert client_module.native_get_seqlen_balanced_partitions(array, k, equal_size) == daemon
    # Other integer dtypes and strided arrays are converted.
    assert client_module.native_get_seqlen_balanced_partitions(
        array.astype(np.int32), k, equal_size) == daemon
    assert client_module.native_get_seqlen_balanced_partitions(
        tuple(lengths), k, equal_size) == daemon
    assert client_module.native_balance(iter(lengths), k, equal_size=equal_size).partitions \
        == client.balance(lengths, k, equal_size=equal_size).partitions
    strided = np.repeat(array, 2)[::2]
    assert client_module.native_get_seqlen_balanced_partitions(strided, k, equal_size) == daemon


PLAN_CASES = [
    # (seed, n, num_ranks, max_token_len, extra)
    (11, 256, 4, 65536, {}),
    (12, 1024, 8, 40000, {"pipeline_model_parallel_size": 4}),
    (13, 300, 2, 33000, {"min_micro_batches": 3, "micro_batches_multiple_of": 2,
                         "pad_to_multiple_of": 128, "overhead": 0}),
    (14, 200, 4, 50000, {"order": "heaviest_first", "equal_size": True,
                         "count_tolerance": 0.05}),
    (15, 3, 2, 40000, {}),  # empty ranks
]


@pytest.mark.parametrize("seed,n,num_ranks,max_token_len,extra", PLAN_CASES)
def test_plan_step_same_as_daemon(client, seed, n, num_ranks, max_token_len, extra):
    lengths = _lengths(random.Random(seed), n)
    daemon = client.plan_step(lengths, num_ranks=num_ranks, max_token_len=max_token_len,
                              **extra)
    native = client_module.native_plan_step(lengths, num_ranks=num_ranks,
                                            max_token_len=max_token_len, **extra)
    assert native == daemon
    assert client_module.native_plan_step(np.asarray(lengths), num_ranks=num_ranks,
                                          max_token_len=max_token_len, **extra) == daemon


def test_plan_step_groups_same_as_daemon(client):
    rng = random.Random(21)
    lengths = _lengths(rng, 256, high=8000)
    groups = [i // 4 for i in range(256)]
    for kwargs in ({}, {"keep_groups": True}):
        daemon = client.plan_step(lengths, num_ranks=4, max_token_len=16384, groups=groups,
                                  **kwargs)
        native = client_module.native_plan_step(lengths, num_ranks=4, max_token_len=16384,
                                                groups=groups, **kwargs)
        assert native == daemon, kwargs


def test_module_level_functions_run_in_process(client, monkeypatch):
    previous = rlsched.set_default_client(None)
    try:
        assert rlsched._in_process()
        lengths = _lengths(random.Random(31), 200)
        assert rlsched.get_seqlen_balanced_partitions(lengths, 4, True) == \
            client.get_seqlen_balanced_partitions(lengths, 4, True)
        assert rlsched.balance(lengths, 4) == client.balance(lengths, 4)
        assert rlsched.plan_step(lengths, num_ranks=2, max_token_len=40000) == \
            client.plan_step(lengths, num_ranks=2, max_token_len=40000)
        assert rlsched.plan_micro_batches(lengths, 40000, pipeline_stages=2) == \
            client.plan_micro_batches(lengths, 40000, pipeline_stages=2)
        # Arguments the direct native calls do not take (raw replies, cost models) go
        # to the in-process client when the module has the wire library (see
        # test_in_process.py), else to the daemon: the same answer either way.
        assert rlsched.balance(lengths, 4, cost="tokens", raw=True).max_cost == \
            rlsched.balance(lengths, 4).max_cost
        monkeypatch.setenv("RLSCHED_NATIVE", "0")
        assert not rlsched._in_process()
    finally:
        other = rlsched.set_default_client(previous)
        if other is not None:
            other.close()
    # An explicit default client takes the module-level calls.
    previous = rlsched.set_default_client(client)
    try:
        assert not rlsched._in_process()
    finally:
        rlsched.set_default_client(previous)


@pytest.mark.parametrize("call,field", [
    (lambda: client_module.native_balance([1, -2, 3], 2), "lengths[1]"),
    (lambda: client_module.native_balance([1, 2, 3], 0), "num_parts"),
    (lambda: client_module.native_balance([1, 2.5], 2), "lengths[1]"),
    (lambda: client_module.native_balance([1, 2], 2, groups=[0]), "groups"),
    (lambda: client_module.native_balance([1, 2], 2, keep_groups=True), "keep_groups"),
    (lambda: client_module.native_balance([1, 2], 2, algorithm="best"), "algorithm"),
    (lambda: client_module.native_balance(np.array([1.0, 2.0]), 2), "lengths"),
    (lambda: client_module.native_plan_step([1, 2], num_ranks=1, max_token_len=0),
     "max_token_len"),
    (lambda: client_module.native_plan_step([1, 2], num_ranks=1, max_token_len=10,
                                            pad_to_multiple_of=-1), "pad_to_multiple_of"),
    (lambda: client_module.native_plan_step([1, 2], num_ranks=1, max_token_len=10,
                                            count_tolerance=2.0), "count_tolerance"),
    (lambda: client_module.native_get_seqlen_balanced_partitions([1, 2, 3], 2, True),
     "equal_size"),
])
def test_bad_input_is_a_value_error_naming_the_field(call, field):
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, rlsched.InvalidArgumentError)
    assert info.value.field == field
    assert field in str(info.value)


def test_native_module_error_has_the_field():
    with pytest.raises(ValueError) as info:
        client_module._native.balance([5, -1], 2)
    assert info.value.field == "lengths[1]"
    assert str(info.value).startswith("lengths[1]: ")


def test_an_index_that_raises_is_that_error():
    # An item whose __index__ raises (or returns a non-int) propagates its exception.
    class Raises:
        def __index__(self):
            raise RuntimeError("no index")

    class NotAnInt:
        def __index__(self):
            return "a"

    with pytest.raises(RuntimeError, match="no index"):
        client_module._native.balance([Raises(), 3], 2)
    with pytest.raises(TypeError):
        client_module._native.balance([NotAnInt(), 3], 2)


def test_threads_share_the_module():
    # The GIL is released while solving: threads run side by side and agree.
    lengths = np.asarray(_lengths(random.Random(41), 20480), dtype=np.int64)
    expected = client_module.native_get_seqlen_balanced_partitions(lengths, 64, True)
    results = [None] * 4

    def work(i):
        results[i] = client_module.native_get_seqlen_balanced_partitions(lengths, 64, True)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4


def _cmake_project_version():
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(\s*rlsched\s+VERSION\s+([0-9.]+)", f.read())
    return root, match.group(1)


def test_one_version_everywhere(rlsched_bin, tmp_path):
    # The top-level CMakeLists.txt's project(VERSION) is the one source: the program,
    # the daemon, the native module, the package and setup.py's metadata agree with it.
    import os
    import subprocess
    import sys
    root, version = _cmake_project_version()
    program = subprocess.run([rlsched_bin, "--version"], capture_output=True, text=True,
                             timeout=60, check=True)
    assert program.stdout == f"rlsched {version}\n"
    assert client_module._native.__version__ == version
    assert rlsched.__version__ == version
    with rlsched.Client(rlsched_bin) as client:
        assert client.ping() == version
    # setup.py --version from another directory (nothing is written to the sources).
    metadata = subprocess.run([sys.executable, os.path.join(root, "setup.py"), "--version"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert metadata.returncode == 0, metadata.stderr
    assert metadata.stdout.strip().splitlines()[-1] == version


def test_partition_weights_takes_weights_beyond_a_length():
    rng = random.Random(43)
    lengths = _lengths(rng, 500)
    # Within a length's bound it is the same partition as partitions().
    for equal_size in (False, True):
        assert client_module._native.partition_weights(lengths, 10, equal_size) == \
            client_module._native.partitions(lengths, 10, equal_size)
    # Workloads above 2^31 (verl's 24576·L + L² for L = 60,000 is 5.07e9).
    weights = [24576 * s + s * s for s in _lengths(rng, 300, 1, 60000)]
    with pytest.raises(ValueError, match=r"lengths\[\d+\]"):
        client_module._native.partitions(weights, 8, False)
    parts = client_module._native.partition_weights(np.asarray(weights, dtype=np.int64), 8)
    assert sorted(i for p in parts for i in p) == list(range(300))
    loads = [sum(weights[i] for i in p) for p in parts]
    assert max(loads) <= -(-sum(weights) // 8) + max(weights)
    with pytest.raises(ValueError, match=r"weights\[2\]: must be >= 0, got -1") as error:
        client_module._native.partition_weights([1, 2, -1], 2)
    assert error.value.field == "weights[2]"
    with pytest.raises(ValueError, match=r"num_parts: must be in \[1, "):
        client_module._native.partition_weights([1, 2], 0)


def test_partition_weights_exact_nodes_bounds_the_exact_search():
    # On small instances the exact search runs after Karmarkar-Karp and refinement: it
    # never leaves a larger max load than without it, and 0 turns it off.
    rng = random.Random(44)
    lower = 0
    for _ in range(200):
        weights = [rng.randint(1, 20000) for _ in range(rng.randint(4, 40))]
        k = rng.randint(2, 6)
        parts = {e: client_module._native.partition_weights(weights, k, False, exact_nodes=e)
                 for e in (None, 0, 50)}
        loads = {e: max(sum(weights[i] for i in p) for p in parts[e]) for e in parts}
        for p in parts.values():
            assert sorted(i for part in p for i in part) == list(range(len(weights)))
        assert loads[None] <= loads[50] <= loads[0]
        lower += loads[None] < loads[0]
    assert lower > 20  # the search found better partitions
    with pytest.raises(ValueError, match=r"exact_nodes: must be >= 0, got -1") as error:
        client_module._native.partition_weights([1, 2], 2, exact_nodes=-1)
    assert error.value.field == "exact_nodes"
