"""cluster=slurm driven from a machine that shares nothing with the cluster (mmt.remote, docs/remote.md): what the
login node's side checks before anything starts, and the settings as it builds the backend from them."""

import dataclasses
import os
import shutil
import subprocess
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # light: the login node's side imports this module before the engine
    from mmt.backends.slurm.sbatch import SlurmSettings

# how long the login node's side waits for squeue's answer before it says SLURM does not answer
ANSWER_S = 30


def cluster_problem() -> Optional[str]:
    """Why SLURM cannot be used from this login shell (no squeue on its PATH, slurmctld not answering), or None."""
    if shutil.which("squeue") is None:
        return "SLURM's commands (squeue) are not on the PATH of a login shell there"
    try:
        done = subprocess.run(
            ["squeue", "--noheader", "--me", "--format=%i"], capture_output=True, text=True, timeout=ANSWER_S
        )
    except subprocess.TimeoutExpired:
        return f"squeue did not answer in {ANSWER_S} s (is slurmctld up?)"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"squeue failed: {said}"
    return None


def settings_there(settings: "SlurmSettings", local_sweep_dir: str, remote_sweep_dir: str) -> "SlurmSettings":
    """submitit's folder in the sweep dir there (it was resolved against the launcher's), SLURM's commands at hand."""
    folder = os.path.abspath(settings.folder)
    if folder == local_sweep_dir or folder.startswith(local_sweep_dir.rstrip("/") + "/"):
        moved = remote_sweep_dir + folder[len(local_sweep_dir) :]
    else:  # a folder outside the sweep dir is the launcher's machine's: the sweep dir's own there
        moved = f"{remote_sweep_dir}/.submitit/%j"
    return dataclasses.replace(settings, folder=moved, over_ssh=False)
