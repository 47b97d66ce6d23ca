"""Stand-ins of the frameworks' modules for the integration tests: modules registered
under the upstream module paths, compiled from source text of the test's own."""

import sys
import types


def register(setitem, packages, modules):
    """Registers each name of `packages` as an empty package, then each (name, source) of
    `modules` as a module compiled from `source` (registered before it runs, so that the
    next sources can import it; a package of `packages` may get its source here too).
    `setitem(name, module)`: sys.modules.__setitem__, or monkeypatch's setitem on it."""
    for name in packages:
        package = types.ModuleType(name)
        package.__file__ = f"/site-packages/{name.replace('.', '/')}/__init__.py"
        package.__path__ = []
        setitem(name, package)
    for name, source in modules:
        module = sys.modules.get(name) if name in packages else types.ModuleType(name)
        if name not in packages:
            module.__file__ = f"/site-packages/{name.replace('.', '/')}.py"
            setitem(name, module)
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    return sys.modules


def fixture(monkeypatch, register_standin, integration):
    """The body of a `standin` fixture: the stand-in registered through monkeypatch,
    yielded, then the integration uninstalled."""
    module = register_standin(lambda name, m: monkeypatch.setitem(sys.modules, name, m))
    yield module
    integration.uninstall()
