"""The live page started for one launch (``hydra.launcher.dashboard=true``, ``mmt run --dashboard``): a child
process serving the sweep's dir on loopback for as long as the launching process lives."""

import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from mmt.core import proctree


class BackgroundDashboard:
    def __init__(self, dirs: List[Path]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mmt.dashboard", *map(str, dirs), "--port", "0"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=lambda: proctree.set_parent_death_signal(signal.SIGTERM),
        )  # goes with the launcher
        first = self.process.stdout.readline() if self.process.stdout else ""
        self.url: Optional[str] = first.split()[2] if first.startswith("mmt dashboard: http") else None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
