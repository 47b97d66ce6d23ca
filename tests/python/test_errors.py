"""Error replies of the daemon, and the client's own argument checks."""

import pickle

import pytest

import rlsched
from rlsched.errors import DaemonError, InvalidArgumentError, RlschedError
from rlsched.v1 import service_pb2


def test_num_parts_zero(client):
    with pytest.raises(RlschedError) as info:
        client.balance([1, 2, 3], 0)
    error = info.value
    assert error.code == "ERROR_CODE_INVALID_ARGUMENT"
    assert error.field == "balance.num_parts"
    assert "num_parts" in error.message and "got 0" in error.message
    assert isinstance(error, InvalidArgumentError) and isinstance(error, ValueError)


@pytest.mark.parametrize("call, field", [
    (lambda c: c.balance([1, -5], 1), "balance.lengths[1]"),
    (lambda c: c.balance([1, 2], 1, groups=[0]), "balance.groups"),
    (lambda c: c.balance([1, 2], 1, keep_groups=True), "balance.keep_groups"),
    (lambda c: c.balance([1, 2], 1, refine_iterations=-1), "balance.refine_iterations"),
    (lambda c: c.balance([1, 2], 1, cost={"kind": "attention", "model": {"hidden_size": 0}}),
     "balance.cost.model.hidden_size"),
    (lambda c: c.plan_step([1, 2], num_ranks=0, max_tokens_per_micro_batch=10),
     "plan_step.num_ranks"),
    (lambda c: c.plan_step([1, 2], num_ranks=1, max_tokens_per_micro_batch=0),
     "plan_step.max_tokens_per_micro_batch"),
    (lambda c: c.plan_micro_batches([1, 20], 10), "plan_step.lengths[1]"),
])
def test_invalid_arguments_name_the_field(client, call, field):
    with pytest.raises(InvalidArgumentError) as info:
        call(client)
    assert info.value.code == "ERROR_CODE_INVALID_ARGUMENT"
    assert info.value.field == field
    assert info.value.message


def test_serving_goes_on_after_errors(client):
    client.ping()
    pid = client.pid
    for _ in range(3):
        with pytest.raises(RlschedError):
            client.balance([1], 0)
    assert client.balance([1, 2], 2).max_cost == 2
    assert client.pid == pid and client.restarts == 0


def test_empty_request(client):
    with pytest.raises(RlschedError) as info:
        client.call(service_pb2.Request())
    assert info.value.code == "ERROR_CODE_EMPTY_REQUEST"
    assert not isinstance(info.value, ValueError)
    assert client.ping()


def test_client_side_checks(client):
    with pytest.raises(InvalidArgumentError) as info:
        client.balance([1, 2], 1, algorithm="fastest")
    assert info.value.field == "balance.algorithm"
    with pytest.raises(InvalidArgumentError) as info:
        client.plan_step([1], num_ranks=1, max_tokens_per_micro_batch=5, order="random")
    assert info.value.field == "plan_step.order"
    with pytest.raises(InvalidArgumentError) as info:
        client.balance([1, 2], 1, cost="quadratic")
    assert info.value.field == "cost.kind"
    with pytest.raises(InvalidArgumentError) as info:
        client.balance([1, 2], 1, cost={"kind": "tokens", "no_such_field": 1})
    assert info.value.field == "cost"
    with pytest.raises(InvalidArgumentError) as info:
        client.balance([1, "x"], 1)
    assert info.value.field == "lengths[1]"
    with pytest.raises(InvalidArgumentError) as info:
        client.balance([1, 2**63], 1)
    assert info.value.field == "lengths"
    assert client.pid is None  # none of these reached the daemon


def test_request_above_the_daemon_cap(rlsched_bin):
    # The daemon answers a frame above --max-message-bytes with BAD_FRAME (id "")
    # and exits with status 2; the client raises it and starts a new daemon next.
    with rlsched.Client(rlsched_bin, args=["--max-message-bytes", "1000"]) as client:
        for n in (1000, 200_000):  # the reply is read before / after a broken pipe
            with pytest.raises(RlschedError) as info:
                client.balance([5000] * n, 2)
            assert info.value.code == "ERROR_CODE_BAD_FRAME"
            assert client.pid is None
            assert client.balance([1, 2, 3], 2).max_cost == 3


def test_errors_pickle():
    for error in (RlschedError("ERROR_CODE_INTERNAL", "boom", "x"),
                  InvalidArgumentError("num_parts: bad", "balance.num_parts"),
                  DaemonError("DAEMON_DIED", "gone")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (copy.code, copy.message, copy.field) == (error.code, error.message,
                                                         error.field)
        assert str(copy) == str(error)
