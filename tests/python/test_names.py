"""One name for one thing (issue 17): the Python arguments are the CLI's flags
(`num_ranks`, `max_token_len`, `pipeline_model_parallel_size`, `bucket_mib`,
`target_dtype="fp8_block128"`), the request fields' names are accepted aliases, and
an error names the argument the caller used, then the field."""

import json
import subprocess

import pytest

import rlsched
from rlsched.errors import InvalidArgumentError

LENGTHS = [900, 30, 4000, 120, 2500, 700, 64, 3100, 1500, 80, 2200, 400]

# A small Llama whose linear weights cover whole 128 × 128 blocks (fp8 applies).
WIDE_LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
    "vocab_size": 1000, "tie_word_embeddings": False,
}


def test_balance_num_ranks_and_its_alias(client):
    canonical = client.balance(LENGTHS, num_ranks=3)
    assert client.balance(LENGTHS, 3) == canonical
    assert client.balance(LENGTHS, num_parts=3) == canonical
    assert rlsched.balance(LENGTHS, num_ranks=3) == canonical
    with pytest.raises(InvalidArgumentError) as info:
        client.balance(LENGTHS, num_ranks=3, num_parts=3)
    assert info.value.field == "num_ranks"
    assert "alias num_parts" in info.value.message
    with pytest.raises(InvalidArgumentError) as info:
        client.balance(LENGTHS)
    assert info.value.message.startswith("num_ranks: required")
    with pytest.raises(InvalidArgumentError) as info:
        client.balance(LENGTHS, num_ranks=0)
    assert info.value.field == "balance.num_parts"
    assert info.value.message == (
        "num_ranks (balance.num_parts): must be in [1, 1048576], got 0")


def test_plan_step_names_and_aliases(client):
    canonical = client.plan_step(LENGTHS, num_ranks=2, max_token_len=4096,
                                 pipeline_model_parallel_size=2, overhead=50)
    aliased = client.plan_step(LENGTHS, num_ranks=2, max_tokens_per_micro_batch=4096,
                               pipeline_stages=2, overhead=50)
    assert aliased == canonical
    assert canonical.ranks and all(r.micro_batches for r in canonical.ranks)
    one_rank = client.plan_micro_batches(LENGTHS, 4096, overhead=50)
    assert client.plan_micro_batches(LENGTHS, max_tokens_per_micro_batch=4096,
                                     overhead=50) == one_rank
    assert rlsched.plan_micro_batches(LENGTHS, max_token_len=4096, overhead=50) == one_rank

    with pytest.raises(InvalidArgumentError) as info:
        client.plan_step(LENGTHS, num_ranks=2, max_token_len=4096,
                         max_tokens_per_micro_batch=4096)
    assert info.value.field == "max_token_len"
    with pytest.raises(InvalidArgumentError) as info:
        client.plan_step(LENGTHS, num_ranks=2)
    assert info.value.message.startswith("max_token_len: required")


@pytest.mark.parametrize("kwargs, field, message", [
    ({"max_token_len": 0}, "plan_step.max_tokens_per_micro_batch",
     "max_token_len (plan_step.max_tokens_per_micro_batch): must be >= 1, got 0"),
    ({"max_token_len": 100, "pipeline_model_parallel_size": 65537},
     "plan_step.pipeline_stages",
     "pipeline_model_parallel_size (plan_step.pipeline_stages): must be <= 65536, got 65537"),
    ({"max_token_len": 1000}, "plan_step.lengths[0]",
     "lengths[0]: sequence of 4000 tokens (padded) exceeds max_token_len = 1000"),
])
def test_plan_step_errors_name_the_argument(client, kwargs, field, message):
    with pytest.raises(InvalidArgumentError) as info:
        client.plan_step([4000, 5], num_ranks=1, **kwargs)
    assert info.value.field == field
    assert info.value.message == message


def test_reshard_bucket_and_dtype_names(client):
    train, infer = {"tp": 2}, {"tp": 2}
    by_mib = client.reshard(WIDE_LLAMA, train=train, infer=infer, bucket_mib=1)
    by_bytes = client.reshard(WIDE_LLAMA, train=train, infer=infer, bucket_bytes=1 << 20)
    assert by_mib == by_bytes
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(WIDE_LLAMA, train=train, infer=infer, bucket_mib=1,
                       bucket_bytes=1 << 20)
    assert info.value.field == "bucket_mib"
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(WIDE_LLAMA, train=train, infer=infer, bucket_mib=(1 << 20) + 1)
    assert info.value.message.startswith("bucket_mib: must be an integer in [0, 1048576]")

    fp8 = client.reshard(WIDE_LLAMA, train=train, infer=infer, target_dtype="fp8_block128")
    assert client.reshard(WIDE_LLAMA, train=train, infer=infer, target_dtype="fp8") == fp8
    assert client.reshard(WIDE_LLAMA, train=train, infer=infer, target_dtype="FP8") == fp8
    bf16 = client.reshard(WIDE_LLAMA, train=train, infer=infer, target_dtype="bf16")
    assert fp8.bytes_received < bf16.bytes_received
    with pytest.raises(InvalidArgumentError) as info:
        client.reshard(WIDE_LLAMA, train=train, infer=infer, target_dtype="fp4")
    assert info.value.field == "reshard.target_dtype"


def test_the_cli_and_python_agree_on_names(client, rlsched_bin, tmp_path):
    """The same words on both sides give the same plan."""
    model = tmp_path / "config.json"
    model.write_text(json.dumps(WIDE_LLAMA))
    for dtype in ("fp8_block128", "fp8", "bf16"):
        cli = subprocess.run(
            [rlsched_bin, "reshard", "--model", str(model), "--train", "tp=2", "--infer",
             "tp=2", "--bucket-mib", "1", "--target-dtype", dtype, "--json"],
            capture_output=True, text=True, timeout=120, check=False)
        assert cli.returncode == 0, cli.stderr
        plan = client.reshard(WIDE_LLAMA, train={"tp": 2}, infer={"tp": 2}, bucket_mib=1,
                              target_dtype=dtype)
        assert int(json.loads(cli.stdout)["bytesReceived" if "bytesReceived" in cli.stdout
                                          else "bytes_received"]) == plan.bytes_received

    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(map(str, LENGTHS)) + "\n")
    cli = subprocess.run(
        [rlsched_bin, "plan-step", str(lengths), "--ranks", "2", "--max-token-len", "4096",
         "--pipeline-model-parallel-size", "2", "--overhead", "50", "--json"],
        capture_output=True, text=True, timeout=120, check=False)
    assert cli.returncode == 0, cli.stderr
    plan = client.plan_step(LENGTHS, num_ranks=2, max_token_len=4096,
                            pipeline_model_parallel_size=2, overhead=50)
    reply = json.loads(cli.stdout)
    assert [[list(map(int, m.get("indices", []))) for m in r.get("micro_batches", [])]
            for r in reply["ranks"]] == [[m.indices for m in r.micro_batches]
                                         for r in plan.ranks]
