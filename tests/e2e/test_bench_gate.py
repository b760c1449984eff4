"""The launch-speed gate (benchmarks/bench_gate.py) fails a change that slows the launch: a copy of this tree whose
host agent sleeps as it starts each job, against this tree's commit, on the local backend (CI runs the gate itself
against the last release, on both backends)."""

import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO

# far above the noise of the tests that run beside this one (pytest-xdist): on CI's loaded host a 2 x 2 probe took
# 7.2 to 18.3 s in one gate run (its median 13.7 s), and an 8 s sleep gave a ratio of 1.23 only; with 30 s the slow
# copy's median is above 1.3x any earlier median seen (the slowest single run seen: 20.5 s)
SLEEP_S = 30.0


def _copy_with_a_slow_agent(dest: Path) -> Path:
    """This checkout's tracked and new files, its local agent made to sleep before it forks each job's ranks: on the
    critical path. (A sleep at the agent's own start overlapped the launcher's composing, and one before the preload
    overlapped the agent's warm-up: CI saw a 6 s sleep there cost 2.8 s, a ratio of 1.22.)"""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source, target = REPO / name.decode(), dest / name.decode()
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    server = dest / "launcher_plugin" / "mmt" / "agent" / "server.py"
    text = server.read_text()
    ready = '        timeline.mark_at(path, timeline.AGENT_READY, node="host")\n'
    assert text.count(ready) == 1, "the agent's job start moved: update this test"
    server.write_text(text.replace(ready, f"{ready}        time.sleep({SLEEP_S})  # the deliberate regression\n"))
    return dest


def test_the_gate_fails_a_change_that_sleeps_at_the_agents_start(tmp_path):
    slow = _copy_with_a_slow_agent(tmp_path / "slow")
    gate = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_gate.py",
            "--against",
            "HEAD",
            "--candidate",
            str(slow),
            "--backend",
            "local",
            "--rounds",
            "3",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert gate.returncode == 1, gate.stdout[-3000:] + gate.stderr[-3000:]
    assert "gate: FAILED" in gate.stdout and "local:" in gate.stdout, gate.stdout[-3000:]
    # both versions' medians are printed, side by side
    assert "a_this_local" in gate.stdout and "b_earlier_local" in gate.stdout
