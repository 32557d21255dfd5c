"""The driver's auto plan trains exactly as the same plan given by hand (pp2 under torchrun on the CPU), and a plan
that fits nothing stops before the first collective with one line."""
from __future__ import annotations

import re

from launch_utils import torchrun

RUN = ("--pp", "2", "--dim", "32", "--depth", "4", "--batch-size", "16", "--steps", "3", "--plan-card", "h100")


def losses(out: str) -> list[str]:
    return re.findall(r"step +\d+ +loss (\S+)", out)


def test_auto_plan_trains_bit_for_bit_like_the_same_flags_by_hand():
    auto = torchrun(2, *RUN)
    assert auto.returncode == 0, auto.stderr
    line = next(x for x in auto.stdout.splitlines() if x.startswith("plan: "))
    flags = re.search(r"\(as flags: (.*)\)", line).group(1).split()
    by_hand = torchrun(2, *RUN, *flags)
    assert by_hand.returncode == 0, by_hand.stderr
    assert losses(auto.stdout) and losses(auto.stdout) == losses(by_hand.stdout)
    assert not any(x.startswith("plan: ") for x in by_hand.stdout.splitlines())  # nothing left to choose
    assert "predicted" in auto.stdout.splitlines()[-1]


def test_a_plan_that_fits_nothing_is_one_line_before_any_collective():
    out = torchrun(2, *RUN, "--memory-cap-gib", "0.00001")
    assert out.returncode != 0
    errors = [x for x in out.stderr.splitlines() if x.startswith("hybrid_engine")]
    assert len(errors) == 1 and "planner: no plan fits" in errors[0]
    assert "step" not in out.stdout and "rank 0" not in out.stdout
