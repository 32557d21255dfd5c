"""The schedule's rules are the C++ core's alone: the driver's configuration check and `python -m
hybrid_engine.schedule` accept exactly the same requests, and refuse the others with the same line."""
import itertools

import pytest

from hybrid_engine import schedule as schedule_command
from hybrid_engine.config.run import ConfigError
from hybrid_engine.models import registry
from hybrid_engine.parallel.pipeline.schedule import SCHEDULES
from hybrid_engine.train.cli import parse_config

REQUESTS = [(name, pp, m, v, k) for name, pp, m, v, k in itertools.product(SCHEDULES, (1, 2, 3), (2, 3, 4), (1, 2, 3),
                                                                             (0, 1, 5))]


def driver_verdict(name: str, pp: int, m: int, v: int, k: int) -> str | None:
    flags = ["--pp", str(pp), "--schedule", name, "--micro-batches", str(m), "--virtual-stages", str(v),
             "--lookahead", str(k), "--depth", "16", "--batch-size", str(12 * m)]
    try:
        parse_config(flags).validate(pp, "cpu", registry.check_model)
    except ConfigError as exc:
        return str(exc)
    return None


def command_verdict(name: str, pp: int, m: int, v: int, k: int, capsys) -> str | None:
    argv = ["--schedule", name, "--pp", str(pp), "--micro-batches", str(m), "--virtual-stages", str(v),
            "--lookahead", str(k)]
    try:
        schedule_command.main(argv)
    except SystemExit as exit_:
        assert exit_.code == 2
        return capsys.readouterr().err.strip().removeprefix("python -m hybrid_engine.schedule: error: ")
    capsys.readouterr()
    return None


def test_driver_and_schedule_command_agree_on_every_request(capsys):
    refused = 0
    for request in REQUESTS:
        driver, command = driver_verdict(*request), command_verdict(*request, capsys)
        assert driver == command, request
        refused += driver is not None
    assert 0 < refused < len(REQUESTS)


@pytest.mark.parametrize("request_", [("gpipe", 2, 4, 2, 0), ("gpipe", 1, 2, 3, 0)])
def test_gpipe_over_several_chunks_is_taken_by_both(request_, capsys):
    """Looped gpipe (torch's ScheduleLoopedBFS) runs on the executor (test_engine_grid_invariance.py)."""
    assert driver_verdict(*request_) is None
    assert command_verdict(*request_, capsys) is None


def test_interleaved_with_one_chunk_is_one_line_from_both(capsys):
    line = ("the interleaved schedule needs --virtual-stages >= 2 (it interleaves model chunks; got 1); with one "
            "stage per rank use 1f1b")
    assert driver_verdict("interleaved", 2, 4, 1, 0) == line
    assert command_verdict("interleaved", 2, 4, 1, 0, capsys) == line
