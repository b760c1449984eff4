"""What mmt knows about the process it started, applied before the user's code runs.

* **Topology.** A framework that initialises the process group with another world than the plan's (a Trainer whose
  ``num_nodes`` is not wired to mmt's) would wait in rendezvous for ranks that never come, until the time limit.
  ``torch.distributed.init_process_group`` is wrapped so that a ``world_size`` or ``rank`` other than the contract's
  fails at once, naming both values and the fix.
* **Rendezvous without torch's back-off.** Rank 0's ``init_process_group`` starts the job's TCP store; a rank
  that connects before it listens is refused and retries only after torch's back-off, about half a second (rank 0
  is often last: it writes the job's ``.hydra/``). Every other rank first waits, in steps of milliseconds, until
  the store's address accepts a connection, then lets torch connect: the same address torch would try, so the
  outcome is unchanged, only sooner.
* **Warnings that are wrong here.** Lightning warns that "the ``srun`` command is available but is not used" on
  any host with SLURM installed (mmt started the ranks itself, or ran them through srun), and that the job dir
  "exists and is not empty" when its CSV logger writes into it (mmt made that dir; the logger appends). Warnings
  the user's own code causes are left alone.
"""

import importlib.abc
import importlib.util
import os
import re
import socket
import sys
import time
import warnings
from typing import Any, Callable, Optional, Tuple
from urllib.parse import urlparse

from mmt.core.rank_env import MASTER_ADDR, MASTER_PORT, MMT_JOB_DIR, RANK, WORLD_SIZE
from mmt.planning.environment import NOT_EMPTY_WARNING, SRUN_WARNING
from mmt.planning.plan import JobPlan

_DISTRIBUTED = "torch.distributed"


class TopologyMismatchError(RuntimeError):
    """The framework asked torch.distributed for another world than the one mmt started."""


def _wiring_hint(plan: JobPlan) -> str:
    return (
        f"HINT: wire the framework's topology to mmt's, e.g. in YAML trainer.num_nodes=${{num_nodes}} "
        f"trainer.devices=${{devices}} (or Trainer(num_nodes={plan.num_nodes}, devices={plan.devices}) from "
        "mmt.RankInfo.from_env()); and no ddp_spawn/ddp_fork/ddp_notebook strategy: mmt starts the ranks"
    )


def check_topology(plan: JobPlan, world_size: Any, rank: Any) -> None:
    expected_world, expected_rank = int(os.environ[WORLD_SIZE]), int(os.environ[RANK])
    asked_world = None if world_size in (None, -1) else int(world_size)
    asked_rank = None if rank in (None, -1) else int(rank)
    if (asked_world is None or asked_world == expected_world) and (asked_rank is None or asked_rank == expected_rank):
        return
    raise TopologyMismatchError(
        f"torch.distributed.init_process_group(world_size={asked_world}, rank={asked_rank}) in a process mmt "
        f"started as rank {expected_rank} of WORLD_SIZE={expected_world} ({plan.num_nodes} nodes x "
        f"{plan.devices} devices): the framework was given another topology than the job's, and its process "
        f"group would wait for ranks that never come. {_wiring_hint(plan)}"
    )


def store_address(init_method: Any, store: Any) -> Optional[Tuple[str, int]]:
    """Where rank 0's TCP store will listen, for ``env://`` (the default) and ``tcp://``; None otherwise."""
    if store is not None:
        return None  # the caller made its own store
    if init_method in (None, "env://"):
        addr, port = os.environ.get(MASTER_ADDR), os.environ.get(MASTER_PORT)
        return (addr, int(port)) if addr and port and port.isdigit() else None
    url = urlparse(str(init_method))
    if url.scheme == "tcp" and url.hostname and url.port:
        return url.hostname, url.port
    return None


def wait_until_listening(address: Tuple[str, int], timeout_s: float) -> bool:
    """Connect to ``address`` until it accepts (then hang up), at most ``timeout_s``: True when it did."""
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while True:
        try:
            with socket.create_connection(address, timeout=min(5.0, timeout_s)):
                return True
        except OSError:  # refused (not listening yet), or not resolvable yet: what torch would retry too
            if time.monotonic() + pause > deadline:
                return False
            time.sleep(pause)
            # milliseconds at first, where the gain is; then no more often than torch's own back-off
            pause = min(pause * 1.5, 0.25)


def _wait_for_rank_zero(args: Any, kwargs: Any) -> None:
    if os.environ.get(RANK, "0") == "0":
        return  # rank 0 starts the store
    address = store_address(
        kwargs.get("init_method", args[1] if len(args) > 1 else None),
        kwargs.get("store", args[5] if len(args) > 5 else None),
    )
    timeout = kwargs.get("timeout", args[2] if len(args) > 2 else None)
    if address is not None:
        wait_until_listening(address, timeout.total_seconds() if timeout is not None else 1800.0)


def _wrap_init(module: Any, plan: JobPlan) -> None:
    original = module.init_process_group
    if getattr(original, "_mmt_checked", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        world_size = kwargs.get("world_size", args[3] if len(args) > 3 else None)
        rank = kwargs.get("rank", args[4] if len(args) > 4 else None)
        check_topology(plan, world_size, rank)
        _wait_for_rank_zero(args, kwargs)
        return original(*args, **kwargs)

    init_process_group._mmt_checked = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    module.init_process_group = init_process_group
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is not None:
        c10d.init_process_group = init_process_group


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once ``name`` has been imported (the module is imported as usual)."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_call(module: Any) -> None:
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call  # type: ignore[method-assign]
        return spec


def _guard_topology(plan: JobPlan) -> None:
    if plan.per_node or RANK not in os.environ:
        return  # a per-node command starts its own ranks in other interpreters
    if _DISTRIBUTED in sys.modules:
        _wrap_init(sys.modules[_DISTRIBUTED], plan)
    else:
        sys.meta_path.insert(0, _AfterImport(_DISTRIBUTED, lambda module: _wrap_init(module, plan)))


def _quiet_wrong_warnings() -> None:
    warnings.filterwarnings("ignore", message=re.escape(SRUN_WARNING))
    job_dir = os.environ.get(MMT_JOB_DIR)
    if job_dir:
        prefix, rest = NOT_EMPTY_WARNING.split("{job_dir}")
        warnings.filterwarnings(
            "ignore", message=re.escape(prefix) + re.escape(job_dir.rstrip("/")) + "/?" + re.escape(rest)
        )


def install(plan: JobPlan) -> None:
    _guard_topology(plan)
    _quiet_wrong_warnings()
