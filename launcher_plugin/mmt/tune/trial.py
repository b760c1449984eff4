"""One tuning trial: run a recipe for a few steps at one micro-batch, in this fresh process, under a memory budget.

``python -m mmt.tune.trial <spec.json>``, started by ``mmt.tune.runner`` once per candidate, so that running out of
memory (or being killed) ends the trial and not the search. Writes ``spec["result"]`` (JSON) and exits 0 when the
candidate fits, 3 when it ran out of memory, 1 on any other error.

How the budget is enforced:

* CPU: ``RLIMIT_DATA``, set before anything is imported. It counts the process's private writable memory (heap,
  anonymous mappings: what tensors live in), allocated whether or not it was touched yet, the way a device
  allocator counts reservations; past it malloc fails and torch raises "can't allocate memory", a clean error.
  ``RLIMIT_AS`` would also count ~0.4 GB of shared-library and reserved address space that ``import torch`` maps
  without using memory (VmSize 713 MB vs VmData 301 MB after torch + lightning here), so its number means little;
  ``RLIMIT_RSS`` is not enforced by Linux, and cgroups need privileges this tool should not ask for.
* GPU: ``torch.cuda.set_per_process_memory_fraction`` (budget / device memory): the caching allocator raises
  CUDA out-of-memory past it.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import traceback
from typing import Any, Dict, List, Optional

OOM_EXIT = 3
_PR_SET_PDEATHSIG = 1
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc")


def _limit_host_memory(budget_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (budget_bytes, budget_bytes))


def _limit_gpu_memory(budget_bytes: int) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), 0)


def _chain(exc: BaseException) -> List[BaseException]:
    """The exception and its causes (instantiate() wraps the recipe's error in its own)."""
    seen: List[BaseException] = []
    current: Optional[BaseException] = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _is_oom(exc: BaseException) -> bool:
    for item in _chain(exc):
        if isinstance(item, MemoryError):
            return True
        if isinstance(item, RuntimeError) and any(t in str(item).lower() for t in _OOM_TEXT):
            return True
    return False


def _summary(exc: BaseException) -> str:
    root = _chain(exc)[-1]
    first_line = str(root).splitlines()[0] if str(root) else ""
    return f"{type(root).__name__}: {first_line}"[:200]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _write(path: str, record: Dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(record, handle)


def _die_with_tuner(tuner_pid: int) -> None:
    """SIGKILL this trial when the tuner goes (Ctrl-C, kill): it runs in a session of its own."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != tuner_pid:  # the tuner died before the death signal was armed
        os._exit(1)


def run(spec: Dict[str, Any]) -> int:
    _die_with_tuner(int(spec["tuner_pid"]))
    if spec["accelerator"] == "cpu" and spec.get("budget_bytes"):
        _limit_host_memory(int(spec["budget_bytes"]))
    sys.path[:] = spec["sys_path"]
    try:
        if spec["accelerator"] == "gpu" and spec.get("budget_bytes"):
            _limit_gpu_memory(int(spec["budget_bytes"]))
        from hydra.utils import instantiate

        result = instantiate(spec["recipe"], _convert_="all")
        rate = result.get("samples_per_s") if isinstance(result, dict) else None
        if not isinstance(rate, (int, float)) or rate <= 0:
            raise RuntimeError(
                f"the recipe returned no samples_per_s (got {result!r:.200}); a tunable recipe "
                "returns a dict with the samples per second of its training steps"
            )
        _write(spec["result"], {"status": "fits", "samples_per_s": float(rate), "peak_rss_mb": _peak_rss_mb()})
        return 0
    except BaseException as exc:  # the trial's outcome, whatever it is, is the answer
        oom = _is_oom(exc)
        traceback.print_exc()
        try:
            _write(
                spec["result"],
                {"status": "oom" if oom else "error", "error": _summary(exc), "peak_rss_mb": _peak_rss_mb()},
            )
        except BaseException:  # no memory left even for that: the exit code still tells
            pass
        return OOM_EXIT if oom else 1


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    code = run(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: with no memory left it can crash and blur the answer


if __name__ == "__main__":
    main()
