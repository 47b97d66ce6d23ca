"""rlsched: a Python client of the ``rlsched serve`` daemon.

The module-level functions share one default :class:`Client` (one daemon
subprocess, started on first use, thread-safe, closed at exit)::

    import rlsched
    parts = rlsched.get_seqlen_balanced_partitions(seqlens, k_partitions=8,
                                                   equal_size=True)
    micro_batches = rlsched.plan_micro_batches(seqlens, max_token_len=16384)
    plan = rlsched.reshard(open("config.json").read(), train={"tp": 8, "pp": 2, "dp": 4},
                           infer={"tp": 4, "replicas": 16}, topology={"colocated": True},
                           bucket_mib=512, target_dtype="fp8_block128")

The arguments have the CLI's names (``num_ranks`` for ``--ranks``, ``max_token_len``
for ``--max-token-len``, ``pipeline_model_parallel_size``, ``bucket_mib``); where a
request field is named otherwise (``num_parts``, ``max_tokens_per_micro_batch``,
``pipeline_stages``, ``bucket_bytes``) the field's name is accepted too.

The daemon is ``<program> serve``, the program from :func:`find_program`:
``$RLSCHED_BIN``, else the program shipped inside the package (``rlsched/bin/rlsched``,
which ``pip install`` builds when the program's packages are present), else ``rlsched``
on ``PATH``. Errors
are :class:`RlschedError` (``.code``, ``.message``, ``.field``);
:class:`InvalidArgumentError` is also a ``ValueError``.

In process: when the native module ``rlsched._native`` imports (built by CMake with
``RLSCHED_BUILD_PYTHON``, into ``<build>/python/rlsched/``), ``balance``,
``plan_step``, ``plan_micro_batches`` and ``get_seqlen_balanced_partitions`` solve in
this process with the same results as the daemon (numpy int64 arrays are read in
place; the GIL is released while solving); arguments only the daemon takes (a cost
model other than tokens, ``raw=True``) still go to it. ``RLSCHED_NATIVE=0``, or a
client given to :func:`set_default_client`, sends every call to the daemon.

Layout: this directory holds the pure-Python code; the protobuf modules generated
from proto/rlsched/v1/*.proto live in the build tree (``<build>/python/rlsched/v1``).
``pkgutil.extend_path`` below adds every ``rlsched`` directory found on
``sys.path`` to this package's ``__path__``, so with
``PYTHONPATH=<repo>/python:<build>/python`` (either order) ``rlsched.v1.service_pb2``
imports. The build directory's ``rlsched/`` has no ``__init__.py`` on purpose.
Installed with pip (``pip install --no-build-isolation .`` at the repository root, see
setup.py), the package holds the native module, the generated modules and
``_version.py`` itself.

With the wire library in the native module (``rlsched._native.HAS_WIRE``: built with
the program, the default, and by pip), the arguments only the daemon used to take (the
attention cost model, ``raw=True``) are answered in process too, by the daemon's own
code (:class:`InProcessClient`, which also does ``reshard`` and ``simulate``), and
:class:`Orchestrator` is the decision core for a framework's own driver loop (events
in, commands out; see :mod:`rlsched.orchestrator`). :func:`plan_step_indices` gives a
step's plan as ``[rank][micro_batch]`` index lists.

Frameworks: :mod:`rlsched.integrations.verl` puts drop-ins for verl's balancing
functions in place (``install()``).
"""

import os as _os
import threading as _threading
from pkgutil import extend_path
from typing import Optional as _Optional

__path__ = extend_path(__path__, __name__)


def _add_editable_dir() -> None:
    # `pip install -e` of the repository (setup.py) imports this directory in place and
    # writes what it builds (the native module, rlsched.v1, _version.py) to
    # <repo>/build-python/editable/rlsched/: a directory like a build tree's, added last.
    root = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    editable = _os.path.join(root, "build-python", "editable", "rlsched")
    if _os.path.isdir(editable) and editable not in __path__:
        __path__.append(editable)


_add_editable_dir()

# Every generated protobuf module is imported before the native module (rlsched.client
# imports it). The native module's C++ messages register the same .proto files in the
# C++ protobuf runtime that python3-protobuf's cpp implementation uses as its pool's
# underlay: a _pb2 module imported after it would take its descriptors from there, and
# its messages would not compare equal to those of modules imported before.
try:
    from rlsched.v1 import (balance_pb2 as _balance_pb2,  # noqa: F401 - imported first
                            reshard_pb2 as _reshard_pb2, orchestrator_pb2 as _orchestrator_pb2,
                            runtime_pb2 as _runtime_pb2, service_pb2 as _service_pb2)
except ImportError:  # no build: rlsched._proto says what is missing
    pass

from rlsched._program import ProgramNotFoundError, find_program
from rlsched.client import (BalanceResult, BaselinePlan, Client,
                            MicroBatch, Part, RankPlan, StepPlan)
from rlsched import client as _client
from rlsched.client import native_available
from rlsched.errors import (DaemonError, InvalidArgumentError,
                            RlschedError)
from rlsched.in_process import InProcessClient
from rlsched import in_process as _in_process_module
from rlsched.orchestrator import Orchestrator, TrainedSample
from rlsched.step_plan import plan_step_indices

__all__ = [
    "Client",
    "RlschedError",
    "InvalidArgumentError",
    "DaemonError",
    "BalanceResult",
    "Part",
    "StepPlan",
    "RankPlan",
    "MicroBatch",
    "BaselinePlan",
    "InProcessClient",
    "Orchestrator",
    "TrainedSample",
    "plan_step_indices",
    "find_program",
    "ProgramNotFoundError",
    "default_client",
    "native_available",
    "set_default_client",
    "ping",
    "balance",
    "plan_step",
    "plan_micro_batches",
    "get_seqlen_balanced_partitions",
    "reshard",
    "simulate",
    "calibrate",
    "__version__",
]


def _find_version() -> str:
    """The project's version: rlsched/_version.py, written by the CMake build (into
    ``<build>/python/rlsched/``) and by setup.py (into an installed package), else, in a
    source checkout without a build, the top-level CMakeLists.txt's
    ``project(rlsched VERSION x.y.z)`` that both read."""
    try:
        from rlsched._version import version
        return version
    except ImportError:
        pass
    import re
    path = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.dirname(
        _os.path.abspath(__file__)))), "CMakeLists.txt")
    try:
        with open(path, encoding="utf-8") as cmake_lists:
            match = re.search(r"project\(\s*rlsched\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)",
                              cmake_lists.read())
    except OSError:
        match = None
    return match.group(1) if match else "0+unknown"


__version__ = _find_version()

_default: _Optional[Client] = None
_default_lock = _threading.Lock()
_in_process_client: _Optional[InProcessClient] = None
# A client given to set_default_client() takes the module-level calls (not the native
# module).
_explicit_default = False


def _in_process() -> bool:
    """Whether the module-level balance, plan_step, plan_micro_batches and
    get_seqlen_balanced_partitions solve in process: the native module imports,
    ``RLSCHED_NATIVE`` is not "0", and no client was set with set_default_client()."""
    return (native_available() and not _explicit_default
            and _os.environ.get("RLSCHED_NATIVE", "1") != "0")


def _fallback() -> Client:
    """Where the module-level calls go that the native module's direct functions do not
    take (a cost model other than tokens, ``raw=True``): in process through
    :class:`InProcessClient` when the module has the wire library (and is in use, see
    _in_process()), else the default client's daemon."""
    global _in_process_client
    if _in_process() and _in_process_module.available():
        with _default_lock:
            if _in_process_client is None:
                _in_process_client = InProcessClient()
            return _in_process_client
    return default_client()


def default_client() -> Client:
    """The shared client of the module-level functions, created on first use
    (``Client()``: the program from :func:`find_program`)."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Client()
        return _default


def set_default_client(client: _Optional[Client]) -> _Optional[Client]:
    """Makes `client` the shared client (None: a new ``Client()`` on next use);
    returns the previous one, which the caller may close."""
    global _default, _explicit_default
    with _default_lock:
        previous, _default = _default, client
        _explicit_default = client is not None
        return previous


def ping() -> str:
    """:meth:`Client.ping` on the default client."""
    return default_client().ping()


def balance(lengths, num_ranks=None, **kwargs):
    """:meth:`Client.balance` on the default client (in process with the native
    module: every option with its wire library, else the token cost)."""
    if _in_process():
        result = _client.native_balance(lengths, num_ranks, **kwargs)
        if result is not NotImplemented:
            return result
    return _fallback().balance(lengths, num_ranks, **kwargs)


def plan_step(lengths, **kwargs):
    """:meth:`Client.plan_step` on the default client (in process with the native
    module: every option with its wire library, else the token cost)."""
    if _in_process():
        result = _client.native_plan_step(lengths, **kwargs)
        if result is not NotImplemented:
            return result
    return _fallback().plan_step(lengths, **kwargs)


def plan_micro_batches(lengths, max_token_len=None, **kwargs):
    """:meth:`Client.plan_micro_batches` on the default client (in process with the
    native module: every option with its wire library, else the token cost)."""
    if _in_process():
        result = _client.native_plan_step(lengths, num_ranks=1, max_token_len=max_token_len,
                                          baseline=False, **kwargs)
        if result is not NotImplemented:
            return [m.indices for m in result.ranks[0].micro_batches]
    return _fallback().plan_micro_batches(lengths, max_token_len, **kwargs)


def reshard(model_config_json, **kwargs):
    """:meth:`Client.reshard` on the default client."""
    return default_client().reshard(model_config_json, **kwargs)


def simulate(config=None, **kwargs):
    """:meth:`Client.simulate` on the default client."""
    return default_client().simulate(config, **kwargs)


def calibrate(measured, config=None):
    """:meth:`Client.calibrate` on the default client."""
    return default_client().calibrate(measured, config)


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    """:meth:`Client.get_seqlen_balanced_partitions` on the default client: a list
    of `k_partitions` lists of indices, each ascending, every index once; raises
    ValueError where the RL frameworks' function of this name asserts. In process
    with the native module."""
    if _in_process():
        return _client.native_get_seqlen_balanced_partitions(seqlen_list, k_partitions,
                                                             equal_size)
    return default_client().get_seqlen_balanced_partitions(seqlen_list, k_partitions,
                                                           equal_size)


def _mirror_signatures() -> None:
    # Show the methods' keyword arguments and documentation on the functions.
    import inspect
    for function in (ping, balance, plan_step, plan_micro_batches,
                     get_seqlen_balanced_partitions, reshard, simulate):
        method = getattr(Client, function.__name__)
        signature = inspect.signature(method)
        setattr(function, "__signature__", signature.replace(
            parameters=list(signature.parameters.values())[1:]))
        function.__doc__ = (f"{inspect.cleandoc(function.__doc__ or '')}\n\n"
                            f"{inspect.getdoc(method)}")


_mirror_signatures()
