"""A refused value's message states the bound it failed and the flag's own name, never a rule the value meets or
another flag."""
from __future__ import annotations

import pytest

from hybrid_engine.config.run import ConfigError
from hybrid_engine.models import registry
from hybrid_engine.train.cli import parse_config


def refusal(*flags: str, world: int = 1) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(list(flags)).validate(world, "cpu", registry.check_model)
    return str(info.value)


@pytest.mark.parametrize("flags, message", [
    (("--memory-cap-gib", "1e-9"), "--memory-cap-gib must be a positive number of GiB, got 1e-09 (at least 1e-06)"),
    (("--lr-warmup", str(10**12)), f"--lr-warmup must be a number of steps >= 0, got {10**12} (at most 2147483647)"),
    (("--seed", str(2**63)), f"--seed must be in [0, 2^63 - 1] (a torch generator's seed), got {2**63} (at most "
                             f"{2**63 - 1})"),
    # a message that states the failed bound already is left as it is
    (("--comm-timeout", "1e9"), "--comm-timeout must be a positive number of seconds, at most 604800 (a week), got "
                                "1000000000.0"),
    (("--steps", "-1"), "--steps must be a number of steps >= 0 (0: set up and stop), got -1"),
])
def test_a_number_out_of_range_names_the_bound_it_failed(flags, message):
    assert refusal(*flags) == message


def test_a_too_large_vocabulary_blames_the_vocabulary_alone():
    assert refusal("--model", "llama", "--vocab-size", str(2**40)) == \
        f"--vocab-size {2**40} is too large (at most 4294967296)"
    assert refusal("--model", "llama", "--max-positions", str(2**31)) == \
        f"--max-positions {2**31} is too large (at most 2147483647)"


@pytest.mark.parametrize("flags, world, message", [
    (("--hidden", "256", "--heads", "6"), 1, "--hidden 256 is not divisible by --heads 6 (give --head-dim)"),
    (("--heads", "4", "--kv-heads", "3"), 1, "--heads 4 is not divisible by --kv-heads 3"),
    (("--head-dim", "33"), 1, "--head-dim 33 is odd: RoPE rotates pairs of features"),
    (("--heads", "4", "--mp", "3"), 3, "--heads 4 is not divisible by --mp 3"),
    (("--hidden", "384", "--heads", "12", "--kv-heads", "4", "--mp", "3"), 3, "--kv-heads 4 and --mp 3: one must divide the other"),
])
def test_a_llama_shape_error_names_every_flag_as_typed(flags, world, message):
    assert refusal("--model", "llama", *flags, world=world).startswith(message)
