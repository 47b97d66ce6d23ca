"""Checks the signatures the integrations were written for against upstream checkouts.

    /usr/bin/python3 scripts/check_upstream_pins.py --verl DIR --slime DIR \
        --nemo-rl DIR --areal DIR

Each DIR is the root of a checkout of the framework (at the commit its module names in
``rlsched.integrations.<framework>``). The upstream files are read as text and parsed
with ``ast``, never imported (the frameworks need packages Debian does not have): for
every Target of the framework's Integration, the function (or the class's method, or a
class's constructor) is found in the module's file and its parameters (names, kinds,
defaults: literals, and names bound to literals at the module's top level) compared
with the Target's signature; a decorated function that a drop-in replaces counts as a
difference, as at install(). Prints one line per target and exits 1 on any difference, 2 on a bad
argument. The frameworks left out are not checked.
"""

import argparse
import ast
import importlib
import inspect
import os
import sys

FRAMEWORKS = {"verl": "verl", "slime": "slime", "nemo-rl": "nemo_rl", "areal": "areal"}
_MISSING = object()


def _constants(tree: ast.Module) -> dict:
    """Top-level NAME = <literal> assignments."""
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return values


def _default(node, constants: dict):
    if node is None:
        return inspect.Parameter.empty
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return f"<{ast.unparse(node)}>"


def _parameters(function: ast.FunctionDef, constants: dict, drop_self: bool) -> list:
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    kinds = ([inspect.Parameter.POSITIONAL_ONLY] * len(args.posonlyargs) +
             [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(args.args))
    out = [(a.arg, kind, _default(d, constants))
           for a, kind, d in zip(positional, kinds, defaults)]
    if args.vararg:
        out.append((args.vararg.arg, inspect.Parameter.VAR_POSITIONAL,
                    inspect.Parameter.empty))
    out += [(a.arg, inspect.Parameter.KEYWORD_ONLY, _default(d, constants))
            for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        out.append((args.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return out[1:] if drop_self else out


def _find(tree: ast.Module, name: str):
    """The FunctionDef of `name` ("f", "Class.method", or "Class": its __init__, whose
    self is then dropped); (node, drop_self) or (None, False)."""
    scope, parts = tree.body, name.split(".")
    for i, part in enumerate(parts):
        node = next((n for n in scope if getattr(n, "name", None) == part), None)
        if node is None:
            return None, False
        if isinstance(node, ast.ClassDef):
            if i == len(parts) - 1:
                init = next((n for n in node.body if getattr(n, "name", None) == "__init__"),
                            None)
                return init, True
            scope = node.body
        else:
            return node, False
    return None, False


def _source(root: str, module: str):
    base = os.path.join(root, *module.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def integrations(framework: str) -> list:
    """The framework's pinned Integrations: every one its module defines (verl's
    drop-ins and its checkpoint-engine interface)."""
    from rlsched.integrations import Integration
    module = importlib.import_module(f"rlsched.integrations.{framework}")
    found = [value for value in vars(module).values() if isinstance(value, Integration)]
    return sorted(found, key=lambda i: i is not module.INTEGRATION)


def check(framework: str, root: str) -> list:
    """(target path, problem or "") for every Target of the framework's Integrations."""
    results = []
    for target in (t for i in integrations(framework) for t in i.targets):
        path = _source(root, target.module)
        if path is None:
            results.append((target.path, f"no file for {target.module} under {root}"))
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        node, drop_self = _find(tree, target.name)
        if node is None:
            results.append((target.path, "not defined"))
            continue
        if target.drop_in is not None and node.decorator_list:
            results.append((target.path, "decorated (a replacement would drop it)"))
            continue
        have = _parameters(node, _constants(tree), drop_self)
        want = [(p.name, p.kind, p.default) for p in target.expected().parameters.values()]
        results.append((target.path, "" if have == want else f"upstream {have}, pinned {want}"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in FRAMEWORKS:
        parser.add_argument(f"--{flag}", metavar="DIR", help=f"a checkout of {flag}")
    args = parser.parse_args()
    given = {module: getattr(args, flag.replace("-", "_")) for flag, module in FRAMEWORKS.items()}
    if not any(given.values()):
        parser.error("give at least one checkout")
    failed = False
    for framework, root in given.items():
        if not root:
            continue
        if not os.path.isdir(root):
            parser.error(f"--{framework.replace('_', '-')}: {root}: not a directory")
        pinned = ", ".join(f"{i.framework} ({i.pinned})" for i in integrations(framework))
        print(f"{pinned} in {root}:")
        for path, problem in check(framework, root):
            print(f"  {'ok  ' if not problem else 'DIFF'} {path}{': ' + problem if problem else ''}")
            failed = failed or bool(problem)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
