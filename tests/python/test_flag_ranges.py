"""A flag's range in --help is the range the program accepts (issue 19).

For every subcommand, the test reads `rlsched <sub> --help`, takes each option's
stated range ("Range: integer in [1, 1048576]", "Range: number in (0, 1000000]",
"Range: integer >= 0", ...) and runs the real program with the bounds and with the
values just outside them: a bound must be accepted (the run succeeds, or is refused
for a reason that does not name the flag, or for the reason the table below
expects), a value outside must be refused with an error naming the flag. The ranges
are read from the help, so a help text and a library bound that disagree fail here.
The table holds only how to run each subcommand cheaply; every ranged option of the
help is probed, and an option without a range that takes a number fails the test.
"""

import json
import os
import re
import subprocess

import pytest

# The ranges are the program's, not its memory safety: the plain build checks them, and
# under a sanitizer the bounds' largest inputs (a million ranks) take minutes.
pytestmark = pytest.mark.skipif(bool(os.environ.get("RLSCHED_SANITIZERS")),
                                reason="checked by the plain build")

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CONFIGS = os.path.join(_REPO, "tests", "data", "configs")
_TIMEOUT = 120
_INT64_MAX = (1 << 63) - 1

_NUMBER = r"-?[0-9.]+(?:e[+-]?[0-9]+)?"
_RANGE = re.compile(
    rf"Range: (integer|number) (?:in ([\[(])({_NUMBER}), ({_NUMBER})\]|(>=|>) ({_NUMBER}))")
# An option's first line: its names, its type, CLI11's notes (REQUIRED, Needs: ...)
# and, after two or more spaces, the start of its description.
_OPTION = re.compile(r"^\s+(-[-\w]+(?:,-[-\w]+)*)(?: ([^\s]+))?(.*)$")


def _tiny_model(tmp_path):
    with open(os.path.join(_CONFIGS, "llama-3.1-70b.json")) as f:
        config = json.load(f)
    config.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(config))
    return str(path)


def _small_run(tmp_path):
    """A run config of one engine, one trainer rank and a step of four short samples:
    `rlsched run` with emulated workers finishes it in about a second."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps({
        "orchestrator": {"prompts_per_step": 2, "samples_per_prompt": 2}, "steps": 1,
        "engines": 1, "engine": {"max_concurrent": 4}, "trainer_ranks": 1,
        "train_seconds_per_step": 1, "weight_sync_seconds": 0.1,
        "lengths": {"mu": 3.0, "sigma": 0.5, "max_tokens": 64}}))
    return str(path)


def _subcommands(tmp_path):
    """subcommand -> (options every run takes, positional arguments, stdin)."""
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("1\n1\n1\n1\n")
    return {
        "balance": ({}, [str(lengths)], b""),
        "plan-step": ({"--max-token-len": "100"}, [str(lengths)], b""),
        "reshard": ({"--model": _tiny_model(tmp_path), "--train": "tp=1", "--infer": "tp=1"},
                    [], b""),
        "simulate": ({"--engines": "1", "--trainer-ranks": "1", "--prompts-per-step": "2",
                      "--samples-per-prompt": "2", "--steps": "1",
                      "--length-dist": "lognormal:3,0.5,64"}, [], b""),
        "serve": ({"--threads": "1"}, [], b""),
        "run": ({"--config": _small_run(tmp_path), "--emulated-engines": "1",
                 "--emulated-trainer": None, "--model": _tiny_model(tmp_path), "--train": "tp=1",
                 "--infer": "tp=1"}, [], b""),
    }


_RUN_STOPPED = {"--weight-sync-address": "stop-before-the-run"}

# (subcommand, flag) -> options added when probing that flag: what makes its bound
# values meaningful on the small inputs above (another option they depend on), or
# keeps a large bound cheap by stopping the run at the work budget (--max-events 1,
# refused naming --max-events, not the probed flag); "_positional" replaces the
# positional arguments.
_EXTRA = {
    ("balance", "--seed"): {"--example": None, "_positional": []},
    ("plan-step", "--seed"): {"--example": None, "--max-token-len": "32768", "_positional": []},
    ("balance", "--num-attention-heads"): {"--hidden-size": str(_INT64_MAX),
                                           "--num-kv-heads": "1"},
    ("balance", "--hidden-size"): {"--num-attention-heads": "1", "--num-kv-heads": "1"},
    ("balance", "--num-kv-heads"): {"--hidden-size": str(_INT64_MAX),
                                    "--num-attention-heads": str(_INT64_MAX)},
    ("balance", "--linear"): {"--quadratic": "1"},
    ("balance", "--quadratic"): {"--linear": "1"},
    ("plan-step", "--num-attention-heads"): {"--hidden-size": str(_INT64_MAX),
                                             "--num-kv-heads": "1"},
    ("plan-step", "--hidden-size"): {"--num-attention-heads": "1", "--num-kv-heads": "1"},
    ("plan-step", "--num-kv-heads"): {"--hidden-size": str(_INT64_MAX),
                                      "--num-attention-heads": str(_INT64_MAX)},
    ("plan-step", "--linear"): {"--quadratic": "1"},
    ("plan-step", "--quadratic"): {"--linear": "1"},
    ("plan-step", "--pad-to-multiple-of"): {"--max-token-len": str(_INT64_MAX)},
    ("plan-step", "--min-micro-batches"): {"--ranks": "1"},
    ("plan-step", "--micro-batches-multiple-of"): {"--ranks": "1"},
    ("simulate", "--release-seconds"): {"--colocated": None},
    ("simulate", "--resume-seconds"): {"--colocated": None},
    ("simulate", "--steps"): {"--max-events": "1"},
    ("simulate", "--engines"): {"--max-events": "1"},
    ("simulate", "--trainer-ranks"): {"--max-events": "1"},
    ("simulate", "--prompts-per-step"): {"--samples-per-prompt": "1", "--max-events": "1"},
    ("simulate", "--samples-per-prompt"): {"--prompts-per-step": "1", "--max-events": "1"},
    ("simulate", "--engine-concurrency"): {"--max-events": "1"},
    ("simulate", "--max-staleness"): {"--max-events": "1"},
    ("simulate", "--staleness-fraction"): {"--max-events": "1"},
    ("simulate", "--oversample"): {"--max-events": "1"},
    ("simulate", "--gpus-per-engine"): {"--max-events": "1"},
    ("simulate", "--gpus-per-trainer-rank"): {"--max-events": "1"},
    # run: the bounds whose run is too long (a step of a million wall seconds, 4,096
    # engine processes or waiting for them, the last step or a timeout before the end)
    # stop after the config and the weight layout are checked, at a
    # --weight-sync-address that is not HOST:PORT; the others run.
    ("run", "--steps"): _RUN_STOPPED,
    ("run", "--emulated-engines"): _RUN_STOPPED,
    ("run", "--wait-for-engines"): _RUN_STOPPED,
    ("run", "--time-scale"): _RUN_STOPPED,
    ("run", "--timeout"): _RUN_STOPPED,
}

# (subcommand, flag, bound value) -> what the error says when a bound is accepted by
# the range but the run is refused for its work, naming the flag (only the smallest
# work budget does).
_REFUSED_FOR_WORK = {
    ("simulate", "--max-events", "1"): "max_events",
}

# Options that take numbers in a compound form, stated in their help and checked by
# their own parsers' tests (simulate_args_test, reshard_cli_test).
_COMPOUND = {"--engine-tokens-per-second", "--length-dist", "--train", "--infer"}


def _help_options(rlsched_bin, subcommand):
    """[(names, type, description)] of `rlsched <subcommand> --help`: an option's line
    starts with its names (then its type and the description, which may continue on
    indented lines); a blank line or a group title ends it."""
    result = subprocess.run([rlsched_bin, subcommand, "--help"], capture_output=True,
                            timeout=_TIMEOUT, check=True, text=True)
    options = []
    current = None
    for line in result.stdout.splitlines():
        match = _OPTION.match(line)
        if match:
            names = [n.strip() for n in match.group(1).split(",")]
            # CLI11's notes (" REQUIRED", " Needs: --example") come first, one space
            # in; the description after two or more spaces.
            rest = re.split(r"\s{2,}", match.group(3).rstrip(), maxsplit=1)
            type_name = match.group(2) or ""
            if type_name.endswith(":"):  # a flag's note ("Excludes:"), not a type
                type_name = ""
            current = [names, type_name, rest[1] if len(rest) == 2 else ""]
            options.append(current)
        elif current is not None and line.startswith("  ") and line.strip():
            current[2] += " " + line.strip()
        else:
            current = None
    return [(names, type_name, text) for names, type_name, text in options
            if names[0] not in ("-h", "--help")]


def _ranges(rlsched_bin, subcommand):
    """[(flag, kind, low, low_open, high or None)] stated in the help."""
    ranges = []
    for names, type_name, text in _help_options(rlsched_bin, subcommand):
        flag = names[0]
        match = _RANGE.search(text)
        if not match:
            continue
        kind = match.group(1)
        parse = int if kind == "integer" else float
        if match.group(2):
            low, high = parse(match.group(3)), parse(match.group(4))
            ranges.append((flag, kind, low, match.group(2) == "(", high))
        else:
            ranges.append((flag, kind, parse(match.group(6)), match.group(5) == ">", None))
    return ranges


def _run(rlsched_bin, subcommand, options, positional, stdin):
    args = [rlsched_bin, subcommand]
    for flag, value in options.items():
        args.append(flag)
        if value is not None:
            args.append(value)
    args += positional
    return subprocess.run(args, input=stdin, capture_output=True, timeout=_TIMEOUT, check=False)


def _text(value):
    return repr(value) if isinstance(value, float) else str(value)


def _probes(kind, low, low_open, high):
    """(accepted values, refused values) of a range."""
    if kind == "integer":
        accepted = [low]
        refused = [low - 1]
        if high is not None:
            accepted.append(high)
            refused.append(high + 1)
        return accepted, refused
    if low_open:
        accepted = [1e-300 if low == 0 else low * (1 + 1e-12)]
        refused = [low]
    else:
        accepted = [low]
        refused = [low - 1e-9 if low == 0 else low * (1 - 1e-12)]
    if high is not None:
        accepted.append(high)
        refused.append(high * (1 + 1e-12) if high > 0 else 1e-9)
    return accepted, refused


_SUBCOMMANDS = ["balance", "plan-step", "reshard", "simulate", "serve", "run"]

# Value types that are not numbers (an option of another type in capitals is taken for
# a number, which must state its range).
_NOT_NUMBERS = ("FILE", "PATH", "NAME", "FILE|DIR", "ADDRESS", "HOST:PORT")


@pytest.mark.parametrize("subcommand", _SUBCOMMANDS)
def test_help_ranges_are_the_accepted_ranges(rlsched_bin, tmp_path, subcommand):
    base, positional, stdin = _subcommands(tmp_path)[subcommand]
    ranges = _ranges(rlsched_bin, subcommand)
    assert ranges, f"{subcommand} --help states no range"
    base_run = _run(rlsched_bin, subcommand, base, positional, stdin)
    assert base_run.returncode == 0, base_run.stderr.decode()

    failures = []
    for flag, kind, low, low_open, high in ranges:
        options = dict(base)
        options.update(_EXTRA.get((subcommand, flag), {}))
        arguments = options.pop("_positional", positional)
        accepted, refused = _probes(kind, low, low_open, high)
        for value in accepted:
            options[flag] = _text(value)
            result = _run(rlsched_bin, subcommand, options, arguments, stdin)
            err = result.stderr.decode()
            expected = _REFUSED_FOR_WORK.get((subcommand, flag, _text(value)))
            ok = result.returncode == 0 or (
                result.returncode == 2 and
                (flag not in err if expected is None else expected in err))
            if not ok:
                failures.append(f"{flag} {_text(value)} (a bound): status {result.returncode}: "
                                f"{err.strip()[:300]}")
        for value in refused:
            options[flag] = _text(value)
            result = _run(rlsched_bin, subcommand, options, arguments, stdin)
            err = result.stderr.decode()
            if result.returncode != 2 or not err.startswith(f"error: {flag}"):
                failures.append(f"{flag} {_text(value)} (outside): status {result.returncode}: "
                                f"{err.strip()[:300]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("subcommand", _SUBCOMMANDS)
def test_every_option_states_its_range_and_default(rlsched_bin, subcommand):
    """A numeric option states its range; an option with a value states its default
    (or that it is required) in words, not as a bracketed value."""
    missing = []
    for names, type_name, text in _help_options(rlsched_bin, subcommand):
        flag = names[0]
        if not type_name or flag in _COMPOUND:
            continue
        numeric = type_name.isupper() and "|" not in type_name and type_name not in _NOT_NUMBERS
        if numeric and not _RANGE.search(text):
            missing.append(f"{flag}: no range")
        if not re.search(r"default|required|Default", text) and type_name not in (
                *_NOT_NUMBERS, "K=V,..."):
            missing.append(f"{flag}: no default")
    assert not missing, "\n".join(missing)
