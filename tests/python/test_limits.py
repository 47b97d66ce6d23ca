"""Never hangs, never runs out of memory: inputs inside the ranges the CLI and the
protos accept that once blew up time or memory. Each runs as a real process under a
2 GiB address-space limit and a timeout, and must end in an answer or a clear error
that names the option or field; the daemon must then answer a ping queued behind."""

import json
import os
import resource
import subprocess

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CONFIGS = os.path.join(_REPO, "tests", "data", "configs")
_ADDRESS_SPACE = 2 << 30
# Far above what each input takes (milliseconds to a few seconds on a loaded 2-core
# machine, under a sanitizer too): a hang or a runaway shows as a timeout.
_TIMEOUT = 120


def _limit():
    # A sanitizer's shadow memory reserves terabytes of address space: there the
    # timeout alone guards (the plain build's run of these tests has the limit).
    if not os.environ.get("RLSCHED_SANITIZERS"):
        resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))


def _run(args, stdin=b""):
    return subprocess.run(args, input=stdin, capture_output=True, timeout=_TIMEOUT,
                          preexec_fn=_limit, check=False)


def _config(tmp_path, name, **changes):
    with open(os.path.join(_CONFIGS, name)) as f:
        config = json.load(f)
    config.update(changes)
    path = tmp_path / f"changed-{name}"
    path.write_text(json.dumps(config))
    return str(path)


def _tiny_llama(tmp_path, layers):
    return _config(tmp_path, "llama-3.1-70b.json", num_hidden_layers=layers, hidden_size=64,
                   intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=1024)


def _cli_cases(tmp_path):
    """(name, arguments after the program, what the error must contain or None for
    an answer)."""
    long_dense = list(range(0, 100_000, 2))
    return [
        ("simulate mtbf 1e-9", ["simulate", "--mtbf", "1e-9"], "--mtbf"),
        ("simulate mtbf 1 async partial",
         ["simulate", "--mtbf", "1", "--mode", "async", "--partial-rollout"], "--mtbf"),
        ("simulate lengths /dev/zero", ["simulate", "--lengths", "/dev/zero"], "line 1"),
        ("simulate config /dev/zero", ["simulate", "--config", "/dev/zero"], "--config"),
        ("balance /dev/zero", ["balance", "--parts", "8", "/dev/zero"], "line 1"),
        ("plan-step forced count",
         ["plan-step", "--multiple-of", "1048576", "--max-tokens", "32768", "--json",
          "--example"],
         "micro_batches_multiple_of"),
        ("reshard DeepSeek 2^31-1 layers",
         ["reshard", "--model", _config(tmp_path, "deepseek-v3.json",
                                        num_hidden_layers=2**31 - 1, moe_layer_freq=2),
          "--train", "tp=1", "--infer", "tp=1"], "num_hidden_layers"),
        ("reshard Qwen3-MoE 2^31-1 layers",
         ["reshard", "--model", _config(tmp_path, "qwen3-235b-a22b.json",
                                        num_hidden_layers=2**31 - 1, decoder_sparse_step=2),
          "--train", "tp=1", "--infer", "tp=1"], "num_hidden_layers"),
        ("reshard long mlp_only_layers",
         ["reshard", "--model", _config(tmp_path, "qwen3-235b-a22b.json",
                                        num_hidden_layers=100_000, mlp_only_layers=long_dense),
          "--train", "tp=1", "--infer", "tp=1"], "num_hidden_layers"),
        ("reshard tiny model of 10^6 layers",
         ["reshard", "--model", _tiny_llama(tmp_path, 1_000_000), "--train", "tp=1",
          "--infer", "tp=1"], "num_hidden_layers"),
        ("reshard Llama-70B 1 MiB buckets",
         ["reshard", "--model", os.path.join(_CONFIGS, "llama-3.1-70b.json"),
          "--train", "tp=8,pp=2,dp=4", "--infer", "tp=4,replicas=16", "--colocated",
          "--bucket-mb", "1"], None),
    ]


@pytest.mark.parametrize("index", range(11))
def test_cli_input_is_answered_or_refused(rlsched_bin, tmp_path, index):
    name, args, error = _cli_cases(tmp_path)[index]
    result = _run([rlsched_bin] + args)
    stderr = result.stderr.decode(errors="replace")
    if error is None:
        assert result.returncode == 0, f"{name}: {stderr[-2000:]}"
    else:
        assert result.returncode == 2, f"{name}: exit {result.returncode}: {stderr[-2000:]}"
        assert error in stderr, f"{name}: {stderr[-2000:]}"
        # A clear error: one line that never echoes the input at length.
        assert len(stderr.strip().splitlines()[-1]) < 1000, name


def _daemon_cases():
    nested = '{"id":"bad","x":' + "[" * 100_000 + "]" * 100_000 + "}"
    simulate_mtbf = json.dumps({"id": "bad", "simulate": {"config": {"engine_mtbf_seconds": 1e-9}}})
    forced = json.dumps({"id": "bad", "plan_step": {
        "lengths": [1, 2, 3], "num_ranks": 8, "max_tokens_per_micro_batch": 16,
        "micro_batches_multiple_of": 1048576}})
    reshard = json.dumps({"id": "bad", "reshard": {
        "model_config_json": json.dumps({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "num_hidden_layers": 2**31 - 1, "decoder_sparse_step": 2, "hidden_size": 64,
            "intermediate_size": 128, "moe_intermediate_size": 32,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1024}),
        "train": {"tp": 1}, "infer": {"tp": 1}}})
    return [("nested arrays", nested, "ERROR_CODE_INVALID_JSON"),
            ("simulate mtbf", simulate_mtbf, "ERROR_CODE_INVALID_ARGUMENT"),
            ("plan_step forced count", forced, "ERROR_CODE_INVALID_ARGUMENT"),
            ("reshard 2^31-1 layers", reshard, "ERROR_CODE_INVALID_ARGUMENT")]


@pytest.mark.parametrize("index", range(4))
def test_daemon_answers_and_serves_the_ping_behind(rlsched_bin, index):
    name, line, code = _daemon_cases()[index]
    stdin = (line + "\n" + '{"id":"after","ping":{}}' + "\n").encode()
    result = _run([rlsched_bin, "serve", "--format", "json", "--threads", "2"], stdin)
    assert result.returncode == 0, f"{name}: {result.stderr.decode(errors='replace')[-2000:]}"
    replies = [json.loads(reply) for reply in result.stdout.decode().splitlines()]
    assert len(replies) == 2, name
    assert replies[0]["id"] == "bad" and replies[0]["error"]["code"] == code, (name, replies[0])
    assert len(replies[0]["error"]["message"]) < 1000, name
    assert replies[1] == {"id": "after", "pong": {"version": replies[1]["pong"]["version"]}}


def test_daemon_deadline_stops_a_long_simulation(rlsched_bin):
    """A simulation that needs minutes is stopped at --request-timeout with
    DEADLINE_EXCEEDED, and the ping behind it is answered."""
    long_run = json.dumps({"id": "long", "simulate": {"config": {"steps": 2000}}})
    stdin = (long_run + "\n" + '{"id":"after","ping":{}}' + "\n").encode()
    result = _run([rlsched_bin, "serve", "--format", "json", "--threads", "2",
                   "--request-timeout", "0.5"], stdin)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    replies = [json.loads(reply) for reply in result.stdout.decode().splitlines()]
    assert replies[0]["id"] == "long"
    assert replies[0]["error"]["code"] == "ERROR_CODE_DEADLINE_EXCEEDED", replies[0]
    assert replies[1]["id"] == "after" and "pong" in replies[1]
