"""The documentation site (mkdocs.yml, docs/): every page in the navigation and every
navigation entry a page; every ```sh and ```python block runs (from a scratch
directory set up as the repository root) unless a `<!-- not-run: why -->` line marks it,
and the ```text block after a command shows lines it prints; `mkdocs build --strict`
passes (a broken link fails it); the paths, `rlsched.*` names and the program's flags a
page names exist; the command reference is what scripts/cli_reference.py makes from
the program now; README.md stays within 200 lines.
"""

import glob
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from doc_blocks import REPO, blocks, missing_lines, sandbox

sys.path.insert(0, os.path.join(REPO, "scripts"))
import cli_reference  # noqa: E402  (scripts/, not a package)

_DOCS = os.path.join(REPO, "docs")
PAGES = sorted(os.path.relpath(p, REPO)
               for p in glob.glob(os.path.join(_DOCS, "**", "*.md"), recursive=True))
BLOCKS = [b for page in PAGES for b in blocks(page) if b.language in ("sh", "python")]
RUN = [b for b in BLOCKS if b.not_run is None]


def _nav_pages(nav):
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from _nav_pages(value)
        else:
            yield value


def test_every_page_is_in_the_navigation_and_back():
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    nav = list(_nav_pages(config["nav"]))
    assert len(nav) == len(set(nav)), "a page listed twice"
    assert sorted(os.path.join("docs", p) for p in nav) == PAGES


def test_no_page_names_an_internal_issue():
    found = []
    for page in PAGES + ["README.md", "benchmarks/README.md"]:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            found += [f"{page}: {m}" for m in
                      re.findall(r"\b[Ii]ssues? ?\d+|issue's|issue-\d+", f.read())]
    assert not found, found


def test_the_readme_is_short():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        assert len(f.read().splitlines()) <= 200


def test_not_run_blocks_say_why():
    for block in BLOCKS:
        assert block.not_run is None or len(block.not_run) >= 10, block
    assert len(RUN) >= 12, [str(b) for b in RUN]


def _env():
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(
        os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    return env


@pytest.mark.parametrize("block", RUN, ids=str)
def test_block_runs(block, rlsched_bin, tmp_path):
    sandbox(str(tmp_path), os.path.dirname(os.path.abspath(rlsched_bin)))
    if block.language == "sh":
        command = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    else:
        command = [sys.executable, "-c", block.text]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=_env())
    assert result.returncode == 0, f"{block}\n{block.text}\n{result.stderr[-3000:]}"
    if block.output is not None:
        missing = missing_lines(block.output, result.stdout)
        assert not missing, f"{block}: not printed: {missing}\n{result.stdout[-3000:]}"


def test_mkdocs_builds_strict(tmp_path):
    if shutil.which("mkdocs") is None:
        pytest.skip("mkdocs is not installed (scripts/setup.sh installs it)")
    result = subprocess.run(["mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    # The Python reference: made from the docstrings, their Sphinx roles rendered as code.
    with open(tmp_path / "site" / "reference" / "python" / "index.html", encoding="utf-8") as f:
        page = f.read()
    assert "plan_step_indices" in page and "get_seqlen_balanced_partitions" in page
    assert not re.search(r":(class|func|meth|mod):<code>", page)


def test_the_command_reference_is_the_programs_help(rlsched_bin):
    with open(os.path.join(_DOCS, "reference", "cli.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == cli_reference.render(rlsched_bin), \
        "docs/reference/cli.md is stale: run scripts/cli_reference.py"


def test_the_program_page_lists_every_command_and_flag(rlsched_bin):
    top = subprocess.run([rlsched_bin, "--help"], capture_output=True, text=True).stdout
    commands = cli_reference.commands(top)
    assert {"balance", "plan-step", "serve", "reshard", "simulate", "run"} <= set(commands)
    usage = next(b.text for b in blocks("docs/reference/program.md")
                 if b.language == "text" and b.text.startswith("rlsched balance"))
    missing = []
    for name in commands:
        assert f"rlsched {name} " in usage, name
        part = re.split(r"\nrlsched [a-z]", usage.split(f"rlsched {name} ", 1)[1], maxsplit=1)[0]
        if "the cost options of balance" in part:
            part += usage.split("rlsched plan-step", 1)[0]
        text = subprocess.run([rlsched_bin, name, "--help"], capture_output=True,
                              text=True).stdout
        for flag in re.findall(r"^  (--[a-z0-9-]+)", text, flags=re.M):
            if flag != "--help" and not re.search(re.escape(flag) + r"(?![a-z-])", part):
                missing.append(f"{name} {flag}")
    assert not missing, missing


def test_the_daemon_guide_names_every_request_kind(rlsched_bin):
    from rlsched.v1 import service_pb2  # generated module

    kinds = [f.name for f in service_pb2.Request.DESCRIPTOR.oneofs_by_name["kind"].fields]
    with open(os.path.join(_DOCS, "guides", "daemon.md"), encoding="utf-8") as f:
        text = f.read()
    paragraph = text[text.index("`rlsched serve` answers"):][:600]
    serve_help = subprocess.run([rlsched_bin, "serve", "--help"], capture_output=True,
                                text=True).stdout
    for kind in kinds:
        assert f"`{kind}`" in paragraph and kind in serve_help, kind


def test_the_protocol_page_names_every_request_kind_and_error_code():
    from rlsched.v1 import service_pb2  # generated module

    with open(os.path.join(_DOCS, "reference", "protocol.md"), encoding="utf-8") as f:
        text = f.read()
    kinds = [f.name for f in service_pb2.Request.DESCRIPTOR.oneofs_by_name["kind"].fields]
    replies = [f.name for f in service_pb2.Reply.DESCRIPTOR.oneofs_by_name["kind"].fields]
    codes = service_pb2.ErrorCode.keys()
    for name in kinds + replies + codes:
        assert f"`{name}`" in text, name


# ---- what the pages name ----

_TOP = ("app", "balance", "benchmarks", "common", "docs", "examples", "proto", "python",
        "rollout", "scheduler", "scripts", "tests", "wire", "workload", ".ci")


def _prose(page):
    """The page's text outside fenced blocks."""
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        text = f.read()
    return re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.S | re.M)


def _spans(page):
    return re.findall(r"`([^`\n]+)`", _prose(page))


def test_named_paths_exist():
    missing = []
    for page in PAGES + ["README.md"]:
        for span in _spans(page):
            for token in span.split():
                path = token.rstrip(".,:;)").split("::")[0]
                if "/" not in path or path.split("/")[0] not in _TOP:
                    continue
                if any(c in path for c in "*<>[]{}…|") or "…" in path:
                    continue  # a pattern, not a path
                path = path.split(":")[0]
                # A benchmark or a tool is named by its program, built from its source.
                if not any(os.path.exists(os.path.join(REPO, path + end))
                           for end in ("", ".cc", ".py")):
                    missing.append(f"{page}: {path}")
    assert not missing, missing


def test_named_rlsched_objects_exist():
    missing = []
    for page in PAGES + ["README.md"]:
        for span in _spans(page):
            for name in re.findall(r"\brlsched(?:\.[A-Za-z_][A-Za-z0-9_]*)+", span.split("/")[0]):
                if not _importable(name):
                    missing.append(f"{page}: {name}")
    assert not missing, missing


def _importable(name):
    try:  # a module (without importing it: some need their framework installed)
        if importlib.util.find_spec(name) is not None:
            return True
    except (ImportError, ValueError):
        pass
    parts = name.split(".")
    if parts[:2] == ["rlsched", "v1"] and len(parts) > 2 and not parts[2].endswith("_pb2"):
        return _proto_name(parts[2:])
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _proto_name(parts):
    """Whether rlsched.v1.<parts> is a service, a message (or a field of one), an enum
    (or a value of one)."""
    import rlsched.v1 as v1
    for path in glob.glob(os.path.join(os.path.dirname(v1.__file__), "*_pb2.py")):
        if os.path.basename(path) == "rollout_pb2.py":
            continue  # the deprecated alias of orchestrator_pb2
        module = importlib.import_module("rlsched.v1." + os.path.basename(path)[:-3])
        file = module.DESCRIPTOR
        if parts[0] in file.services_by_name:
            return len(parts) == 1
        if parts[0] in file.enum_types_by_name:
            return len(parts) == 1 or parts[1] in file.enum_types_by_name[parts[0]].values_by_name
        if parts[0] in file.message_types_by_name:
            message = file.message_types_by_name[parts[0]]
            for part in parts[1:]:
                if part in message.fields_by_name:
                    field = message.fields_by_name[part]
                    message = field.message_type or message
                elif part in message.nested_types_by_name:
                    message = message.nested_types_by_name[part]
                else:
                    return False
            return True
    return False


def _program_flags(rlsched_bin):
    top = subprocess.run([rlsched_bin, "--help"], capture_output=True, text=True).stdout
    flags = {}
    for name in [""] + cli_reference.commands(top):
        args = [rlsched_bin] + ([name] if name else []) + ["--help"]
        text = subprocess.run(args, capture_output=True, text=True).stdout
        flags[name] = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", text))
    return flags


def test_named_program_flags_exist(rlsched_bin):
    flags = _program_flags(rlsched_bin)
    every = set().union(*flags.values())
    unknown = []
    for page in PAGES + ["README.md"]:
        for span in _spans(page):
            command = re.match(r"(?:build/)?rlsched ([a-z-]+)", span)
            named = [f for f in re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", span)
                     if not f.endswith("-")]  # `--emulated-*`: a family of flags
            if command and command.group(1) in flags:  # `rlsched simulate --x`
                known = flags[command.group(1)] | flags[""]
                unknown += [f"{page}: {span}: {f}" for f in named if f not in known]
            elif span.startswith("--"):  # a flag alone: some command's
                unknown += [f"{page}: {f}" for f in named[:1] if f not in every
                            and f not in _OTHER_PROGRAMS_FLAGS]
    assert not unknown, unknown


def _script_flags():
    """The flags the repository's scripts, examples and benchmarks define."""
    found = set()
    for path in glob.glob(os.path.join(REPO, "examples", "**", "*.py"), recursive=True) + \
            glob.glob(os.path.join(REPO, "benchmarks", "*.py")) + \
            glob.glob(os.path.join(REPO, "scripts", "*.py")) + \
            glob.glob(os.path.join(REPO, "python", "rlsched", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            found |= set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", f.read()))
    for path in glob.glob(os.path.join(REPO, "benchmarks", "*.cc")):
        with open(path, encoding="utf-8") as f:
            found |= set(re.findall(r"\"(--[a-z0-9-]+)\"", f.read()))
    return found


# Flags the pages name alone that belong to other programs: the repository's scripts,
# examples and benchmarks, and pip, CTest, mkdocs and Google Benchmark.
_OTHER_PROGRAMS_FLAGS = _script_flags() | {
    "--no-build-isolation", "--no-index", "--break-system-packages", "--system-site-packages",
    "--output-on-failure", "--strict", "--benchmark_filter", "--benchmark_format"}


def test_the_readmes_links_resolve():
    broken = []
    for page in ("README.md", "benchmarks/README.md", "tests/data/README.md"):
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
            if not os.path.exists(os.path.join(REPO, path)):
                broken.append(f"{page}: {target}")
    assert not broken, broken


def test_each_figure_was_made_by_the_current_script_from_the_current_inputs(rlsched_bin):
    import make_figures  # scripts/
    with open(make_figures.DIGESTS, encoding="utf-8") as f:
        recorded = json.load(f)
    assert sorted(recorded) == sorted(make_figures.NAMES)
    pages = "".join(open(os.path.join(REPO, p), encoding="utf-8").read() for p in PAGES)
    for name in make_figures.NAMES:
        assert os.path.exists(os.path.join(make_figures.IMAGES, name + ".png")), name
        assert f"images/{name}.png" in pages, f"no page shows {name}.png"
        data = make_figures.inputs(name, rlsched_bin)
        assert recorded[name] == make_figures.digest(name, data), \
            f"docs/images/{name}.png is stale: run scripts/make_figures.py"
