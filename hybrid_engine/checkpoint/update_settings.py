"""The settings of the update a manifest records besides the state (the lr schedule; the optimizer's betas, weight
decay and clipping: train/update_settings.py computes them), and the one note said for each that a continued
checkpoint recorded with another value: the run goes on with its own, never silently."""
from __future__ import annotations

# manifest key -> the note said when a continued checkpoint's value differs ({changed}: "key old -> new, ...")
SAID_AS = {"lr_schedule": "the lr schedule differs from the one {path} was trained on ({changed}): from step {step} "
                          "the lr follows this run's",
           "optimizer_settings": "the optimizer settings differ from those {path} was trained on ({changed}): from "
                                 "step {step} the update follows this run's"}


def changes(saved: dict, now: dict, path: str, step: int) -> list[str]:
    """'note: ...' for each setting of SAID_AS that checkpoint `path`'s manifest (`saved`) records with another
    value than this run's (`now`); a checkpoint that records none (an older one) is said nothing of."""
    notes = []
    for key, note in SAID_AS.items():
        theirs, ours = saved.get(key), now.get(key)
        if not isinstance(theirs, dict) or ours is None or theirs == ours:
            continue
        changed = ", ".join(f"{k} {theirs.get(k)} -> {v}" for k, v in ours.items() if theirs.get(k) != v)
        notes.append("note: " + note.format(path=path, step=step, changed=changed))
    return notes
