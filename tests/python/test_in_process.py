"""rlsched.InProcessClient against the daemon: the same requests give the same replies
(balance and plan_step with the attention cost model and raw replies, reshard,
simulate, ping), and the same errors (class, code, field, message); the module-level
functions answer every option in process. Skipped when the native module lacks the wire
library."""

import json
import random

import pytest

import rlsched
from rlsched import in_process

pytestmark = pytest.mark.skipif(
    not in_process.available(),
    reason="rlsched._native was built without the wire library (or not at all)")

MODEL = {"hidden_size": 2048, "num_layers": 16, "ffn_hidden_size": 8192,
         "num_attention_heads": 16, "num_kv_heads": 4, "vocab_size": 32000}
ATTENTION = {"kind": "attention", "model": MODEL}
TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
    "vocab_size": 1000, "tie_word_embeddings": False,
}
SMALL_SIMULATION = {"engines": 2, "steps": 2, "trainer_ranks": 2,
                    "orchestrator": {"prompts_per_step": 4, "samples_per_prompt": 2}}


@pytest.fixture
def local():
    with rlsched.InProcessClient() as c:
        yield c


def _lengths(seed, n):
    rng = random.Random(seed)
    return [rng.randint(1, 16384) for _ in range(n)]


@pytest.mark.parametrize("method,args,kwargs", [
    ("balance", (_lengths(1, 300), 8), {"cost": ATTENTION}),
    ("balance", (_lengths(2, 100), 4), {"cost": ATTENTION, "equal_size": True, "raw": True}),
    ("balance", (_lengths(3, 64), 4), {"cost": {"kind": "attention",
                                                "coefficients": {"linear": 1, "quadratic": 0.01}},
                                       "groups": [i // 4 for i in range(64)],
                                       "keep_groups": True}),
    ("plan_step", (_lengths(4, 500),), {"num_ranks": 4, "max_token_len": 40000,
                                        "cost": ATTENTION}),
    ("plan_step", (_lengths(5, 200),), {"num_ranks": 2, "max_token_len": 20000,
                                        "cost": ATTENTION, "pipeline_model_parallel_size": 2,
                                        "raw": True}),
    ("plan_micro_batches", (_lengths(6, 100), 30000), {"cost": ATTENTION}),
    ("get_seqlen_balanced_partitions", (_lengths(7, 96), 8, True), {}),
    ("reshard", (json.dumps(TINY_LLAMA),), {"train": {"tp": 2, "pp": 2, "dp": 2},
                                            "infer": {"tp": 4, "replicas": 2},
                                            "include_transfers": True}),
    ("simulate", (SMALL_SIMULATION,), {}),
])
def test_same_replies_as_the_daemon(client, local, method, args, kwargs):
    assert getattr(local, method)(*args, **kwargs) == getattr(client, method)(*args, **kwargs)


@pytest.mark.parametrize("method,args,kwargs", [
    ("balance", ([1, 2], 0), {}),
    ("balance", ([1, -2], 2), {"cost": ATTENTION}),
    ("balance", ([1, 2], 2), {"cost": {"kind": "attention", "model": {"hidden_size": 0}}}),
    ("plan_step", ([1, 50000],), {"num_ranks": 1, "max_token_len": 40000, "cost": ATTENTION}),
    ("reshard", (json.dumps(TINY_LLAMA),), {"train": {}, "infer": {"tp": 1},
                                            "bucket_bytes": -5}),
    ("simulate", ({"engines": 0},), {}),
])
def test_same_errors_as_the_daemon(client, local, method, args, kwargs):
    with pytest.raises(rlsched.RlschedError) as daemon:
        getattr(client, method)(*args, **kwargs)
    with pytest.raises(rlsched.RlschedError) as here:
        getattr(local, method)(*args, **kwargs)
    assert type(here.value) is type(daemon.value)  # noqa: E721 - the same class exactly
    assert (here.value.code, here.value.field, here.value.message) == \
        (daemon.value.code, daemon.value.field, daemon.value.message)
    assert here.value.field


def test_ping_and_close(local):
    assert local.ping() == rlsched.__version__
    local.close()
    with pytest.raises(rlsched.DaemonError):
        local.ping()


def test_module_level_functions_take_every_option_in_process(client, monkeypatch):
    previous = rlsched.set_default_client(None)
    try:
        lengths = _lengths(8, 256)
        # No daemon is started for the cost model, raw replies, or plan_micro_batches.
        monkeypatch.setattr(rlsched, "default_client", lambda: pytest.fail("daemon used"))
        assert rlsched.balance(lengths, 4, cost=ATTENTION) == \
            client.balance(lengths, 4, cost=ATTENTION)
        assert rlsched.plan_step(lengths, num_ranks=2, max_token_len=40000, cost=ATTENTION,
                                 raw=True) == \
            client.plan_step(lengths, num_ranks=2, max_token_len=40000, cost=ATTENTION,
                             raw=True)
        assert rlsched.plan_micro_batches(lengths, 40000, cost=ATTENTION) == \
            client.plan_micro_batches(lengths, 40000, cost=ATTENTION)
    finally:
        other = rlsched.set_default_client(previous)
        if other is not None:
            other.close()


def test_threads_share_the_in_process_client(local):
    import threading
    lengths = _lengths(9, 4096)
    expected = local.balance(lengths, 16, cost=ATTENTION)
    results = [None] * 4

    def work(i):
        results[i] = local.balance(lengths, 16, cost=ATTENTION)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4


@pytest.mark.parametrize("call", [
    lambda f: f.plan_step([3, 4, 5], num_ranks=1, max_token_len=2 ** 63),
    lambda f: f.plan_step([3, 4, 5], num_ranks=2 ** 64, max_token_len=10),
    lambda f: f.plan_step([3, 4, 5], num_ranks=1, max_token_len=10, overhead=-2 ** 70),
    lambda f: f.plan_step([3, 4, 5], num_ranks=1, max_token_len=10, min_micro_batches=1.5),
    lambda f: f.plan_micro_batches([3, 4, 5], 2 ** 63),
])
def test_the_module_functions_and_the_daemon_refuse_big_ints_alike(client, call):
    # In process these dumped pybind11's signature as a TypeError; through the daemon
    # protobuf's ValueError named no argument.
    errors = []
    for functions in (rlsched, client):
        with pytest.raises(rlsched.InvalidArgumentError) as raised:
            call(functions)
        errors.append((raised.value.field, raised.value.message))
    assert errors[0] == errors[1] and errors[0][0], errors


def test_the_module_functions_take_a_generator_as_the_daemon_does(client):
    lengths = [3, 4, 5, 6, 9, 1]
    want = client.get_seqlen_balanced_partitions(iter(lengths), 2, False)
    assert rlsched.get_seqlen_balanced_partitions((x for x in lengths), 2, False) == want
    plan = rlsched.plan_step((x for x in lengths), num_ranks=2, max_token_len=16)
    assert plan.sequences == len(lengths)
