"""Error replies of the daemon, and the client's own argument checks."""

import ast
import builtins
import pathlib
import pickle

import pytest

import rlsched
from rlsched import errors
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


# The package's sources (not an installed copy).
_PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "rlsched"
# The builtins the package may raise as they are: NotImplementedError marks an abstract
# method, AssertionError a line that cannot be reached.
_BUILTINS_ALLOWED = {"NotImplementedError", "AssertionError"}


def _is_builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def _name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else ""


def _bare_raises(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            name = _name(node.exc.func if isinstance(node.exc, ast.Call) else node.exc)
            if _is_builtin_exception(name) and name not in _BUILTINS_ALLOWED:
                yield node.lineno, f"raise {name}"


def _builtin_only_classes(tree: ast.AST):
    """Public exception classes whose bases are all builtins (so not RlschedErrors)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and node.bases \
                and node.name != "RlschedError":
            bases = [_name(b) for b in node.bases]
            if all(_is_builtin_exception(b) for b in bases):
                yield node.lineno, f"class {node.name}({', '.join(bases)})"


def test_the_package_raises_only_rlsched_errors():
    sources = sorted(_PACKAGE.rglob("*.py"))
    assert len(sources) > 20, _PACKAGE
    found = []
    for path in sources:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, what in [*_bare_raises(tree), *_builtin_only_classes(tree)]:
            found.append(f"{path.relative_to(_PACKAGE.parent)}:{line}: {what}")
    assert found == [], "not an RlschedError:\n" + "\n".join(found)


@pytest.mark.parametrize("cls, builtin, code", [
    (errors.WeightSyncError, RuntimeError, "WEIGHT_SYNC_FAILED"),
    (errors.ExecutorError, RuntimeError, "EXECUTOR_FAILED"),
    (errors.WorkerError, RuntimeError, "WORKER_FAILED"),
])
def test_run_time_failures_are_runtime_errors(cls, builtin, code):
    error = cls("transfer 3: no longer contiguous", "lm_head.weight")
    assert isinstance(error, RlschedError) and isinstance(error, builtin)
    assert not isinstance(error, ValueError)
    assert (error.code, error.message, error.field) == (
        code, "transfer 3: no longer contiguous", "lm_head.weight")
    assert str(error) == f"{code}: transfer 3: no longer contiguous (field lm_head.weight)"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and str(copy) == str(error)
    assert errors.plain_message(error) == "transfer 3: no longer contiguous"
    assert errors.plain_message(KeyError("x")) == "'x'"


def test_a_missing_dependency_or_program_is_still_the_builtin():
    missing = errors.MissingDependencyError("needs torch")
    assert isinstance(missing, ImportError) and str(missing) == "MISSING_DEPENDENCY: needs torch"
    assert type(pickle.loads(pickle.dumps(missing))) is errors.MissingDependencyError
    program = rlsched.ProgramNotFoundError("rlsched program not found")
    assert isinstance(program, FileNotFoundError) and isinstance(program, RlschedError)
    assert program.code == "PROGRAM_NOT_FOUND" and program.errno == 2
    copy = pickle.loads(pickle.dumps(program))
    assert (type(copy), copy.message, copy.errno) == (type(program), program.message, 2)
