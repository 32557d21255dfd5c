"""README.md stays true: a front page (short, its links resolving, every command with a time, the clean launcher
in its examples), its API snippet runs as written on one and on two ranks, and its first-ten-minutes path
(prepare a text, train the GPT, sample from it) runs as written, on a few steps."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
TIME = re.compile(r"\d+(\.\d+)?\s*(s|min|minutes|seconds)\b|\d+:\d\d")


def _text() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def _section(heading: str) -> str:
    """The README's section under `## heading...` up to the next `## `."""
    match = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", _text(), re.M | re.S)
    assert match, f"README.md has no section '## {heading}'"
    return match.group(1)


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def _commands(block: str) -> list[tuple[str, str]]:
    """(command, the comments it stands under or beside) for each command of a bash block: a run of comment lines
    heads the commands below it, up to the next comment; a line ending in a backslash continues on the next."""
    out, heading, pending, inline, after_comment = [], "", "", "", False
    for line in block.splitlines():
        stripped = line.strip()
        if not pending and stripped.startswith("#"):
            heading = (heading + " " if after_comment else "") + stripped
            after_comment = True
            continue
        after_comment = False
        if not stripped:
            continue
        body, _, comment = line.partition("  #")
        pending, inline = pending + body.strip().rstrip("\\") + " ", inline + " " + comment
        if not body.rstrip().endswith("\\"):
            out.append((pending.strip(), heading + inline))
            pending, inline = "", ""
    return out


def test_the_readme_is_a_front_page():
    text = _text()
    assert len(text.encode()) <= 15 * 1024
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert os.path.exists(os.path.join(REPO, link)), link
    commands = [c for block in _blocks(text, "bash") for c in _commands(block)]
    assert len(commands) >= 6
    for command, comments in commands:
        assert TIME.search(comments), f"no time said for: {command}"
        assert not command.startswith("torchrun"), f"the README's examples use python -m hybrid_engine.launch: {command}"


def _launch(cwd, ranks: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybrid_engine.launch", f"--nproc_per_node={ranks}", *args],
                          cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_the_readme_api_snippet_runs_as_written_on_one_and_two_ranks(tmp_path):
    snippets = _blocks(_section("Your own model"), "python")
    assert len(snippets) == 1
    (tmp_path / "my_train.py").write_text(snippets[0])
    printed = {}
    for ranks in (1, 2):
        run = _launch(tmp_path, ranks, "my_train.py")
        assert run.returncode == 0, run.stderr[-3000:]
        printed[ranks] = [float(x) for x in re.findall(r"^step \d+: loss ([0-9.]+)$", run.stdout, re.M)]
    assert len(printed[1]) == 3 and printed[1][-1] < 0.7 * printed[1][0], printed
    assert printed[2] == printed[1]  # pp=2 trains the same model on the same numbers


def _shrunk(command: str, runs: str) -> str:
    """The README's command on a few steps and tokens, writing under `runs` instead of the repository's runs/."""
    for pattern, value in ((r"--steps \d+", "--steps 4"), (r"--eval-every \d+", "--eval-every 2"),
                           (r"--tokens \d+", "--tokens 20"), (r"--lr-warmup \d+", "--lr-warmup 1")):
        if re.search(r"hybrid_engine\.(launch|sample)", command) and pattern.split()[0] in command:
            command = re.sub(pattern, value, command)
    return re.sub(r"(?<![\w/.-])runs(?=/|\s|$)", runs, command)


def test_the_first_ten_minutes_run_as_written_on_a_few_steps(tmp_path):
    (block,) = _blocks(_section("The first ten minutes"), "bash")
    commands = [command for command, _ in _commands(block)]
    assert [c.split()[0:3] for c in commands] == [
        ["mkdir", "-p", "runs"], ["python", "-m", "hybrid_engine.data"], ["python", "-m", "hybrid_engine.launch"],
        ["python", "-m", "hybrid_engine.sample"]]
    runs = str(tmp_path / "runs")
    outputs = []
    for command in commands:
        shrunk = _shrunk(command, runs).replace("python -m", f"{sys.executable} -m", 1)
        done = subprocess.run(["bash", "-o", "pipefail", "-ec", shrunk], cwd=REPO, env=ENV, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, (shrunk, done.stderr[-3000:])
        outputs.append(done.stdout)
    assert "--steps 4" in _shrunk(commands[2], runs) and "--tokens 20" in _shrunk(commands[3], runs)
    assert os.path.getsize(os.path.join(runs, "code.txt")) > 100_000
    assert re.search(r"wrote .*code\.tok: \d+ tokens, vocabulary 256", outputs[1])
    train = outputs[2]
    assert re.search(r"^step 3: validation loss [0-9.]+$", train, re.M) and "summary: 2 ranks (2 dp" in train
    assert open(os.path.join(runs, "gpt", "latest")).read().strip() == "step_000004"
    assert outputs[3].startswith("    def ") and len(outputs[3]) > len("    def ")


@pytest.mark.parametrize("doc", ["architecture.md", "api.md", "gpt.md", "llama.md", "checkpoints.md", "failures.md",
                                 "performance.md", "planning.md", "cluster.md", "kernels.md"])
def test_the_docs_state_what_is_and_link_to_what_exists(doc):
    path = os.path.join(REPO, "docs", doc)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert not re.search(r"since removed|issue #?\d+|\bjob \d+ (before|after)\b|no longer", text, re.I), doc
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert os.path.exists(os.path.join(os.path.dirname(path), link)), (doc, link)
