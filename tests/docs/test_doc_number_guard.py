"""No measured number joins README.md or docs/ unheld: every number that reads as a measurement (number_scan.py says
what that is) is one a claim of test_doc_numbers.py fills from its results file (a number written into a claim's
template is not held), or sits inside a phrase not_measurements.py names with why it is no measurement (or, in
its short UNSOURCED list, why the page still states a number no results file holds)."""
from __future__ import annotations

import pytest

from claims_text import CLAIMS as TEXT_CLAIMS
from doc_sources import page
from not_measurements import NOT_MEASUREMENTS, UNSOURCED
from number_scan import PAGES, measured_numbers, spans
from test_doc_numbers import CLAIMS


def _value_spans(text: str, shown: str, values: list[str]) -> list[tuple[int, int]]:
    """Where a claim's numbers (not its template's own words) sit in the page, at each place the claim is shown."""
    shown_text = shown.format(*values)
    out = []
    for start, _ in spans(text, shown_text):
        at = start
        for literal, value in zip(shown.split("{}"), values):
            at += len(literal)
            out.append((at, at + len(value)))
            at += len(value)
    return out


def _held(name: str) -> list[tuple[int, int]]:
    """The stretches of a page the claims' numbers fill (a claim the page does not show fails test_doc_numbers.py)
    and the phrases named as no measurement."""
    text, out = page(name), []
    for claim_page, shown, *values in CLAIMS + TEXT_CLAIMS:
        if claim_page == name:
            out += _value_spans(text, shown, [value() for value in values])
    excused = [(page_, phrase) for page_, phrase, _ in NOT_MEASUREMENTS + UNSOURCED if page_ == name]
    return out + [s for _, phrase in excused for s in spans(text, phrase)]


@pytest.mark.parametrize("name", PAGES)
def test_every_measured_number_is_held_or_named_no_measurement(name):
    held = _held(name)
    loose = [(page(name)[max(0, a - 60):b + 20], number) for a, b, number in measured_numbers(name)
             if not any(x < b and a < y for x, y in held)]
    assert not loose, (f"{name}: numbers no claim holds (add a claim in claims_text.py reading its results file, or "
                       f"name it in not_measurements.py with why it is no measurement): {loose}")


def test_every_excused_phrase_is_on_its_page_and_says_why():
    for name, phrase, why in NOT_MEASUREMENTS + UNSOURCED:
        assert name in PAGES and phrase in page(name), (name, phrase)
        assert why.strip(), phrase


def test_the_scan_sees_a_new_number():
    """The scan's patterns catch the forms the pages write measurements in (and a hold excuses only its own span)."""
    import number_scan
    text = ("ran 12,345 tokens/s (41.2% MFU), 1.06× torch, 40.25 ms a step, 19.35 GiB, 64.9k samples/s, 250–410 µs, "
            "~9 s on 2 cores | 4.112 | in dp2 × pp2 with --steps 800")
    found = [m.group() for m in number_scan.MEASURED.finditer(text)]
    assert found == ["12,345 tokens/s", "41.2%", "1.06×", "40.25 ms", "19.35 GiB", "64.9k", "250–410 µs", "9 s",
                     "4.112"], found
