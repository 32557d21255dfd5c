"""docs/llama.md stays true: every flag it names exists in the command it is given to (or, in prose, in one of the
commands), its links resolve, its result tables are the committed results files' numbers, and its Hugging Face
path (make a stand-in model directory, tokenize with its tokenizer, import, fine-tune on mp 2, sample, export,
load the export in transformers) runs as written on a few steps."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "llama.md")
RESULTS = os.path.join(REPO, "experiments", "results")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
       "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# the program a command runs -> the argv that prints its --help
PROGRAMS = {"hybrid_engine.py": ["hybrid_engine.py"], "hybrid_engine.sample": ["-m", "hybrid_engine.sample"],
            "hybrid_engine.hf import": ["-m", "hybrid_engine.hf", "import"],
            "hybrid_engine.hf export": ["-m", "hybrid_engine.hf", "export"],
            "hybrid_engine.data prepare": ["-m", "hybrid_engine.data", "prepare"]}
LAUNCHER = {"--nproc_per_node"}  # torchrun's, before hybrid_engine.py


def _text() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def _commands(block: str) -> list[str]:
    """The commands of a bash block: comments dropped, backslash continuations joined, a heredoc kept whole."""
    out, pending, heredoc = [], "", None
    for line in block.splitlines():
        if heredoc is not None:
            pending += line + "\n"
            if line.strip() == heredoc:
                out.append(pending)
                pending, heredoc = "", None
            continue
        stripped = line.strip()
        if not stripped or (not pending and stripped.startswith("#")):
            continue
        body = line.split("  #")[0].rstrip()
        match = re.search(r"<<'(\w+)'$", body)
        if match:
            pending, heredoc = pending + body + "\n", match[1]
            continue
        pending += body.rstrip("\\").strip() + " "
        if not body.endswith("\\"):
            out.append(pending.strip())
            pending = ""
    return out


def _bash_commands() -> list[str]:
    return [c for block in re.findall(r"^```bash\n(.*?)^```", _text(), re.M | re.S) for c in _commands(block)]


@pytest.fixture(scope="module")
def known_flags() -> dict[str, set[str]]:
    out = {}
    for name, argv in PROGRAMS.items():
        done = subprocess.run([sys.executable, *argv, "--help"], cwd=REPO, env=ENV, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, (name, done.stderr[-2000:])
        out[name] = set(FLAG.findall(done.stdout))
    return out


def _program(command: str) -> str | None:
    for name in sorted(PROGRAMS, key=len, reverse=True):
        if name in command:
            return name
    return None


def test_every_flag_the_doc_names_exists(known_flags):
    commands = _bash_commands()
    checked = 0
    for command in commands:
        program = _program(command)
        if program is None or "<<" in command:
            continue
        for flag in FLAG.findall(command):
            assert flag in known_flags[program] | LAUNCHER, f"{flag} is no flag of {program}: {command}"
            checked += 1
    assert checked > 20
    every = set().union(*known_flags.values())
    for flag in FLAG.findall(re.sub(r"^```.*?^```", "", _text(), flags=re.M | re.S)):
        assert flag in every, f"the prose names {flag}, which no command has"


def test_the_links_resolve_and_the_doc_states_what_is():
    text = _text()
    assert not re.search(r"since removed|issue #?\d+|no longer", text, re.I)
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert os.path.exists(os.path.join(REPO, "docs", link)), link
    for doc in ("gpt.md", "performance.md"):
        with open(os.path.join(REPO, "docs", doc), encoding="utf-8") as f:
            assert "(llama.md" in f.read(), f"docs/{doc} does not link docs/llama.md"


def test_the_result_tables_are_the_committed_numbers():
    text = _text()
    with open(os.path.join(RESULTS, "cpu", "2026-11-27-llama-vs-gpt-text.json")) as f:
        curve = json.load(f)["target"]["val_loss_llama_gpt"]
    for name, i in (("Llama", 1), ("GPT", 2)):
        cells = [c.strip().strip("*") for c in re.search(rf"^\| {name} \|(.*)\|$", text, re.M)[1].split("|")]
        assert cells == [f"{point[i]:.3f}" for point in curve], name
    verdicts = [(v, float(x)) for v, x in re.findall(r"\*\*(met|missed)\*\*, ([0-9.]+)×", text)]
    for phase in ("1xH200-llama-1gpu", "4xH200-llama-4gpu"):
        with open(os.path.join(RESULTS, f"2026-11-27-{phase}.json")) as f:
            data = json.load(f)
        assert f"experiments/results/2026-11-27-{phase}.json" in text
        for run in data["runs"].values():
            assert f"{run['per_s']:,.0f}" in text, run["cmd"]
        for goal, t in data["targets"].items():
            if t["target"] is not None:
                verdict = "met" if t["met"] else "missed"
                assert any(v == verdict and abs(x - t["value"]) < 0.006 for v, x in verdicts), goal


def _shrunk(command: str, runs: str) -> str:
    """The doc's command on a few steps and tokens, writing under `runs` instead of the repository's runs/."""
    if "hybrid_engine.py" in command:
        command = re.sub(r"--steps \d+", "--steps 4", re.sub(r"--eval-every \d+", "--eval-every 2", command))
        command = re.sub(r"--lr-warmup \d+", "--lr-warmup 2", command)
    command = re.sub(r"--tokens \d+", "--tokens 8", command).replace("max_new_tokens=40", "max_new_tokens=8")
    return re.sub(r"(?<![\w/.-])runs(?=/|\s|$)", runs, command)


def test_the_hugging_face_path_runs_as_written_on_a_few_steps(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    section = re.search(r"^## Hugging Face in.*?^```bash\n(.*?)^```", _text(), re.M | re.S)[1]
    commands = _commands(section)
    assert [c.split()[:3] for c in commands] == [
        ["mkdir", "-p", "runs"], ["python", "-m", "hybrid_engine.data"], ["python", "-", "<<'EOF'"],
        ["python", "-m", "hybrid_engine.data"], ["python", "-m", "hybrid_engine.hf"],
        ["python", "-m", "hybrid_engine.launch"], ["python", "-m", "hybrid_engine.sample"],
        ["python", "-m", "hybrid_engine.hf"], ["python", "-", "<<'EOF'"]]
    runs = str(tmp_path / "runs")
    out = []
    for command in commands:
        shrunk = _shrunk(command, runs)
        done = subprocess.run(["bash", "-o", "pipefail", "-ec", shrunk], cwd=REPO, env=ENV, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, (shrunk, done.stdout[-2000:], done.stderr[-3000:])
        out.append(done.stdout)
    assert "--steps 4" in _shrunk(commands[5], runs) and "--mp 2" in commands[5]
    assert re.search(r"wrote .*code-bpe\.tok: \d+ tokens, vocabulary 1024", out[1])
    assert re.search(r"wrote .*code-llama\.tok: \d+ tokens, vocabulary 1024$", out[3].strip())
    assert "--config" in out[4] and "model.toml" in out[4]
    train = out[5]
    assert "model: Llama, 4 layers, hidden 128, 4 heads (2 kv)" in train
    assert "summary: 2 ranks (1 dp x 1 pp x 2 mp" in train
    assert re.search(r"^step 3: validation loss [0-9.]+$", train, re.M) and "started from" in train
    assert open(os.path.join(runs, "llama-ft", "latest")).read().strip() == "step_000004"
    assert out[6].startswith("    def ") and len(out[6]) > len("    def ")
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(os.path.join(runs, "llama-ft-hf")))
    # transformers' greedy continuation of the export is the engine's own greedy continuation of the checkpoint
    # (a prefix of it where transformers stops at the config's end-of-sequence id)
    greedy = subprocess.run([sys.executable, "-m", "hybrid_engine.sample", "--load", os.path.join(runs, "llama-ft"),
                             "--prompt", "    def ", "--tokenizer", os.path.join(runs, "tiny-llama"), "--tokens", "8",
                             "--temperature", "0"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    theirs = out[8][:-1]  # print's newline
    assert greedy.returncode == 0 and len(theirs) > len("    def ") and greedy.stdout.startswith(theirs), (
        greedy.stdout, out[8])
