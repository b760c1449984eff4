"""Preemption and requeue: mmt owns the requeue signal, and only mmt. The scheduler is the backend's business: its
task tells each rank, through the variables below, how often the job may be requeued and the command that requeues
it (SLURM's: ``scontrol requeue <job id>``, ``mmt.backends.slurm.task``); nothing here knows a scheduler.

The scheduler sends ``SIGUSR2`` to every task before the time limit (SLURM: ``#SBATCH --signal=USR2@N``), and a
site sends it on preemption (``scancel --signal=USR2``). Exactly one component may act on it, or a job is
checkpointed twice, requeued twice, or killed while saving (submitit #1709, Lightning #20056). mmt takes it:

* every rank of a job that may be requeued installs :func:`install` (the worker does, when the task sets
  ``MMT_PREEMPTIBLE=1``), replacing submitit's handler (submitit still submits and watches the job; its own
  checkpoint/requeue never runs), and Lightning's SLURM auto-requeue is switched off
  (:func:`mmt.lightning.cluster_environment`); the node agent forwards the signal to the ranks it forked;
* the handler only sets a flag (and, the first time, writes one line with ``os.write``: a ``print`` there could
  re-enter the ``sys.stdout`` the rank was writing to and crash it) and acknowledges the signal in a file, so that
  the node agent forwards it only to a rank SLURM itself did not reach (each rank takes it once); training code
  (``mmt.lightning.RequeueOnSignal``) agrees on it across ranks at a step boundary, checkpoints at the next epoch
  end (where Lightning resumes exactly), and calls :func:`requeue`; the requeued job starts again in the same
  output dir and resumes from that checkpoint.

Outside such a job nothing is installed and :func:`requested` is always False.
"""

import os
import shlex
import signal
import subprocess

REQUEUE_SIGNAL = signal.SIGUSR2
# set by the backend's task for every rank: take the signal; how often the job may be requeued
# (hydra.launcher.max_requeues); the job's restart count (the scheduler's own variables are not every rank's);
# the file that marks this restart as requeued, so that the job's own conclusion does not report it as ended
PREEMPTIBLE_VAR = "MMT_PREEMPTIBLE"
MAX_REQUEUES_VAR = "MMT_MAX_REQUEUES"
RESTARTS_VAR = "MMT_REQUEUE_COUNT"
MARKER_VAR = "MMT_REQUEUE_MARKER"
# the command that asks the scheduler to requeue this job (shell words), set by the backend's task
REQUEUE_COMMAND_VAR = "MMT_REQUEUE_COMMAND"
# the file this rank creates when it takes the signal (the node agent reads it before forwarding)
ACK_VAR = "MMT_REQUEUE_ACK"

_state = {"installed": False, "requested": False}


class Requeued(Exception):
    """Raised on every rank once the job has been checkpointed and requeued; the task then exits quietly."""


def _handle(signum: int, _frame: object) -> None:
    """Signal-safe: no Python I/O objects (a second signal, or one that lands inside a print of the rank's own,
    would re-enter them: ``RuntimeError: reentrant call inside BufferedWriter``), and idempotent."""
    if _state["requested"]:
        return
    _state["requested"] = True
    ack = os.environ.get(ACK_VAR)
    try:
        if ack:
            os.close(os.open(ack, os.O_WRONLY | os.O_CREAT, 0o600))
        os.write(
            1, f"mmt: received {signal.Signals(signum).name}: checkpoint and requeue at the next epoch end\n".encode()
        )
    except OSError:
        pass


def install() -> None:
    """Make the requeue signal set a flag in this process (called by the SLURM task wrapper)."""
    signal.signal(REQUEUE_SIGNAL, _handle)
    _state["installed"] = True


def installed() -> bool:
    return _state["installed"]


def requested() -> bool:
    """True once this process received the requeue signal."""
    return _state["requested"]


def restarts() -> int:
    return int(os.environ.get(RESTARTS_VAR) or 0)


def may_be_requeued() -> bool:
    """Whether SLURM may requeue this job (max_requeues > 0: ``--requeue``), by itself too: a lost node, scontrol
    requeue. A recipe then checkpoints where it resumes exactly, not only on the signal."""
    return installed() and int(os.environ.get(MAX_REQUEUES_VAR, "0") or 0) > 0


def requeue_allowed() -> bool:
    return restarts() < int(os.environ.get(MAX_REQUEUES_VAR, "0") or 0)


def requeue() -> None:
    """Ask the scheduler to requeue this job (same job, same output dir), with the command its backend gave. Call
    on one rank, after checkpointing."""
    command = os.environ.get(REQUEUE_COMMAND_VAR)
    if not command:
        raise RuntimeError(f"{REQUEUE_COMMAND_VAR} is not set: this is not a rank of a job that can be requeued")
    marker = os.environ.get(MARKER_VAR)
    if marker:
        open(marker, "w").close()
    subprocess.run(shlex.split(command), check=True, capture_output=True, text=True, timeout=60)
