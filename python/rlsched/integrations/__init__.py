"""rlsched inside the RL frameworks: drop-ins for their balancing functions.

Each framework's module (:mod:`rlsched.integrations.verl`, ...) holds its adapters and
one :class:`Integration`: the upstream repository and commit the adapters were written
for, and per replaced function its module path, its name and its signature at that
commit. This module is the mechanism they share:

* :meth:`Integration.check` compares every upstream function with the signature the
  adapter was written for (parameter names, kinds, order and defaults, as
  :func:`inspect.signature` gives them; annotations are not compared) and lists the
  differences;
* :meth:`Integration.install` replaces nothing unless every function matches (else it
  raises :class:`IncompatibleUpstreamError` naming the function, the parameter and the
  commit; a function wrapped by a decorator counts as a difference, since replacing it
  would drop the decorator) and the solver the drop-ins need is there (else
  ImportError), then sets the drop-ins as module attributes, and also wherever a loaded
  module bound the upstream function, under any name (``from pkg.mod import f as g``
  before the install, in the framework or in a user's recipe); modules imported later
  bind the drop-ins; ``install(force=True)`` replaces the functions that exist whatever
  their signatures;
* :meth:`Integration.uninstall` puts back what it replaced, and the drop-ins that
  modules imported since bound.

A framework that is not importable is not an error: ``install()`` returns ``[]``.
Install in every process that balances (in Ray, e.g. through the runtime environment's
``worker_process_setup_hook``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import threading
from typing import Any, Callable, Optional, Sequence

from rlsched.errors import InvalidArgumentError, MissingDependencyError, RlschedError

__all__ = ["Target", "Integration", "IncompatibleUpstreamError", "INCOMPATIBLE_UPSTREAM",
           "needs_native", "signature_differences", "plan_step_indices"]

#: ``code`` of :class:`IncompatibleUpstreamError`.
INCOMPATIBLE_UPSTREAM = "INCOMPATIBLE_UPSTREAM"


class IncompatibleUpstreamError(RlschedError, TypeError):
    """An upstream function differs from the one an adapter was written for; ``field``
    is ``"<module>.<function>"``. Nothing was replaced."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(INCOMPATIBLE_UPSTREAM, message, field)


@dataclasses.dataclass(frozen=True)
class Target:
    """One upstream function and its drop-in.

    ``signature``: the upstream parameter list at the pinned commit, as Python source
    without annotations, e.g. ``"(batch, max_token_len, dp_group=None)"``; the drop-in
    must have the same one (the tests check it). ``name`` may be ``"Class.method"`` (a
    method, replaced on its class; a class's own signature is its constructor's). A
    target without a drop-in is checked, not replaced: an upstream interface the
    adapters build on."""

    module: str
    name: str
    signature: str
    drop_in: Optional[Callable] = None

    def __post_init__(self) -> None:
        if self.drop_in is not None and self.name.count(".") > 1:
            raise InvalidArgumentError(f"{self.path}: a module's function or a class's "
                                       "method", "name")

    def expected(self) -> inspect.Signature:
        namespace: dict[str, Any] = {}
        exec(f"def _upstream{self.signature}: pass", {}, namespace)  # our own literal
        return inspect.signature(namespace["_upstream"])

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"


def _describe(parameter: inspect.Parameter) -> str:
    default = "" if parameter.default is inspect.Parameter.empty else f"={parameter.default!r}"
    return f"{parameter.name}{default} ({parameter.kind.description})"


def _same_default(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # a default whose == raises is a difference
        return False


def signature_differences(function: Callable, expected: inspect.Signature) -> list[str]:
    """What differs between ``function``'s parameters and ``expected``'s, each naming
    the parameter ([] when they match)."""
    try:
        actual = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as error:
        return [f"its signature cannot be read ({error})"]
    wanted = list(expected.parameters.values())
    differences = []
    for position in range(max(len(actual), len(wanted))):
        have = actual[position] if position < len(actual) else None
        want = wanted[position] if position < len(wanted) else None
        if have is None:
            assert want is not None  # one of the two lists is longer
            differences.append(f"parameter {position + 1} '{want.name}' is missing")
        elif want is None:
            differences.append(f"parameter {position + 1} '{have.name}' ({_describe(have)}) "
                               "is new")
        elif (have.name != want.name or have.kind != want.kind
              or not _same_default(have.default, want.default)):
            differences.append(f"parameter {position + 1} is {_describe(have)}, "
                               f"expected {_describe(want)}")
    return differences


class Integration:
    """The drop-ins of one framework, pinned to an upstream commit (see the module
    docstring). Thread-safe; installing twice is a no-op that returns the same list."""

    def __init__(self, framework: str, repository: str, commit: str,
                 targets: Sequence[Target], ready: Optional[Callable[[], None]] = None) -> None:
        self.framework = framework
        self.repository = repository
        self.commit = commit
        self.targets = tuple(targets)
        # Raises ImportError when the drop-ins cannot run (e.g. no native module).
        self._ready = ready
        self._lock = threading.Lock()
        # (module, attribute, the original it held, the drop-in set) for what is replaced.
        self._replaced: list[tuple[Any, str, Any, Callable]] = []
        # The upstream functions by name, from the last install (kept after uninstall for
        # a drop-in that a module imported in between still holds).
        self.originals: dict[str, Callable] = {}

    @property
    def pinned(self) -> str:
        return f"{self.repository} {self.commit}"

    def _import(self, module: str) -> Optional[Any]:
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name and module.startswith(error.name):
                return None  # the framework (or this module of it) is not installed
            raise

    def check(self) -> list[str]:
        """The differences between the installed framework and the pinned commit, one
        line each naming the function and the parameter; [] when it matches or is not
        installed."""
        problems = []
        for target in self.targets:
            module = self._import(target.module)
            if module is None:
                continue
            function = _lookup(module, target.name)
            if not callable(function):
                problems.append(f"{target.path}: not defined")
                continue
            if function is target.drop_in:
                continue
            if getattr(function, "__wrapped__", None) is not None:
                problems.append(f"{target.path}: wrapped by a decorator ({function!r}), which "
                                "a replacement would drop")
            problems.extend(f"{target.path}: {difference}"
                            for difference in signature_differences(function, target.expected()))
        return problems

    def install(self, *, force: bool = False) -> list[str]:
        """Replaces the upstream functions by the drop-ins; returns what it replaced
        (``"<module>.<function>"``), [] when the framework is not importable.
        Raises :class:`IncompatibleUpstreamError` (replacing nothing) when a function
        is missing or its signature differs from the pinned commit's, unless `force`."""
        with self._lock:
            if self._replaced:
                return _names(self._replaced)
            modules = {t.module: self._import(t.module) for t in self.targets}
            if all(module is None for module in modules.values()):
                return []
            problems = [] if force else self.check()
            missing = [t.module for t in self.targets if modules[t.module] is None]
            if missing and not force:
                problems.append(f"{missing[0]}: not importable")
            if problems:
                raise IncompatibleUpstreamError(
                    f"{self.framework}: the installed version differs from {self.pinned}, "
                    f"which rlsched's drop-ins were written for: {'; '.join(problems)}. "
                    "Nothing was replaced; install(force=True) replaces them anyway",
                    problems[0].split(":", 1)[0])
            if self._ready is not None:
                self._ready()
            originals, replaced = {}, []
            for target in self.targets:
                module = modules[target.module]
                original = None if module is None else _lookup(module, target.name)
                if target.drop_in is None or not callable(original) \
                        or original is target.drop_in:
                    continue
                originals[target.name] = (original, target.drop_in)
                if "." in target.name:  # a method: on its class
                    owner, method = target.name.split(".")
                    replaced.append((_lookup(module, owner), method, original, target.drop_in))
            replaced += _bindings({id(o): (o, d) for name, (o, d) in originals.items()
                                   if "." not in name})
            for owner, name, _, drop_in in replaced:
                setattr(owner, name, drop_in)
            self.originals.update({name: o for name, (o, _) in originals.items()})
            self._replaced.extend(replaced)
            return _names(replaced)

    def uninstall(self) -> list[str]:
        """Puts back what :meth:`install` replaced where the drop-in is still in place,
        and the drop-ins that modules imported since bound; returns what it restored."""
        with self._lock:
            restored = []
            for module, name, original, drop_in in reversed(self._replaced):
                if module.__dict__.get(name) is drop_in:
                    setattr(module, name, original)
                    restored.append((module, name, original, drop_in))
            back = {id(t.drop_in): (t.drop_in, self.originals[t.name]) for t in self.targets
                    if t.drop_in is not None and t.name in self.originals}
            for module, name, drop_in, original in _bindings(back):
                setattr(module, name, original)
                restored.append((module, name, original, drop_in))
            self._replaced.clear()
            return _names(restored)

    def installed(self) -> list[str]:
        """What is replaced now (``"<module>.<function>"``)."""
        with self._lock:
            return _names(self._replaced)


def _lookup(module: Any, name: str) -> Any:
    """``module.<name>`` (dotted: a class's attribute) without running descriptors; a
    class or static method as its function."""
    value = module
    for part in name.split("."):
        try:
            value = inspect.getattr_static(value, part)
        except AttributeError:
            return None
    if isinstance(value, (classmethod, staticmethod)):
        value = value.__func__
    return value


def _bindings(objects: dict) -> list[tuple[Any, str, Any, Any]]:
    """(module, name, old, new) for every global of a loaded module outside rlsched that
    is one of the `objects` ({id(old): (old, new)}), under any name."""
    found = []
    for module_name, module in list(sys.modules.items()):
        if module_name == "rlsched" or module_name.startswith("rlsched."):
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for name, value in list(namespace.items()):
            pair = objects.get(id(value))
            if pair is not None and pair[0] is value:
                found.append((module, name, value, pair[1]))
    return found


def _names(entries) -> list[str]:
    def where(owner: Any) -> str:
        if isinstance(owner, type):
            return f"{owner.__module__}.{owner.__qualname__}"
        return getattr(owner, "__name__", str(owner))

    return [f"{where(entry[0])}.{entry[1]}" for entry in entries]


def needs_native(framework: str) -> Callable[[], None]:
    """An Integration's `ready` check: ImportError unless rlsched's native module (which
    every drop-in solves with, in process) is importable."""
    def ready() -> None:
        from rlsched import client
        if client._native is None:
            raise MissingDependencyError(
                f"rlsched.integrations.{framework} needs the native module rlsched._native: "
                "install the package with pip (see README.md) or build with "
                "-DRLSCHED_BUILD_PYTHON=ON; nothing was replaced")
    return ready


def plan_step_indices(lengths: Any, num_ranks: int, max_token_len: int,
                      **options: Any) -> tuple[list, int, int]:
    """``rlsched._native.plan_step_indices`` for the drop-ins: ``(plan, micro_batches,
    empty_micro_batches)``, ``plan[r][k]`` the ascending indices of rank r's k-th
    micro-batch. A list is handed over as it is (ints, integral floats, numpy integers);
    any other sequence, or a list with an entry the native module refuses, as int() of
    each entry, as the frameworks' own functions read them. Raises
    :class:`~rlsched.InvalidArgumentError` naming the argument."""
    from rlsched import client
    if isinstance(lengths, list):
        try:
            return client._native_solve(client._native.plan_step_indices, lengths, num_ranks,
                                        max_token_len, **options)
        except InvalidArgumentError as error:
            if not error.field.startswith("lengths["):
                raise
    return client._native_solve(client._native.plan_step_indices,
                                [int(length) for length in lengths], num_ranks, max_token_len,
                                **options)
