"""The batch shell and the preemption handler under real signals (issue 21), in processes of their own: no cluster
needed, but real bash and real Python processes, so not the unit tier."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers.sbatch import render, sbatch_plan, slurm_settings


def test_the_batch_shell_survives_usr2_and_usr1(tmp_path):
    script = render(sbatch_plan(), slurm_settings())
    traps = [line for line in script.splitlines() if line.startswith("trap ") and "USR2" in line]
    assert traps, script
    # the trap, run by bash around a foreground child: the signals neither kill the shell nor reach the child ignored
    body = "\n".join(traps + ["sleep 1.5", "echo survived", "trap -p USR2 >/dev/null"])
    shell = subprocess.Popen(["bash", "-c", body], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    shell.send_signal(signal.SIGUSR2)
    shell.send_signal(signal.SIGUSR1)
    out, _ = shell.communicate(timeout=10)
    assert shell.returncode == 0 and "survived" in out


# ---------------------------------------------------------------------------------------- 4: the preemption handler

_NOISY_RANK = textwrap.dedent("""
    import os, sys, time
    from mmt.core import preemption

    class Guarded:
        \"\"\"sys.stdout as BufferedWriter guards it: a write while one is under way (a signal handler's, run while
        the rank's own write waits on a full pipe) raises instead of interleaving.\"\"\"
        def __init__(self, raw):
            self.raw, self.busy = raw, False
        def write(self, text):
            if self.busy:
                raise RuntimeError("reentrant call inside <stdout>")
            self.busy = True
            try:
                time.sleep(0.001)  # a write blocked on the pipe: signals are handled meanwhile
                return self.raw.write(text)
            finally:
                self.busy = False
        def flush(self):
            self.raw.flush()

    preemption.install()
    print("ready", flush=True)
    sys.stdout = Guarded(sys.stdout)
    deadline = time.time() + float(sys.argv[1])
    while time.time() < deadline:
        print("x" * 200, flush=True)
    print("requested" if preemption.requested() else "not requested", file=sys.stderr, flush=True)
""")


def test_usr2_twice_within_milliseconds_20_times_never_crashes_a_printing_rank(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).parents[2] / "launcher_plugin"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    for attempt in range(20):
        rank = subprocess.Popen(
            [sys.executable, "-c", _NOISY_RANK, "0.6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        assert rank.stdout.readline() == b"ready\n"
        time.sleep(0.05)
        rank.send_signal(signal.SIGUSR2)
        time.sleep(0.002)
        rank.send_signal(signal.SIGUSR2)
        time.sleep(0.02)
        out, err = rank.communicate(timeout=30)
        assert rank.returncode == 0, (attempt, err.decode()[-2000:])
        assert err.decode().strip().endswith("requested") and b"not requested" not in err
        assert out.count(b"mmt: received SIGUSR2") == 1, attempt


# ---------------------------------------------------------------------------------------- 4: signal_delay_s
