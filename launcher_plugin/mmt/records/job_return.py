"""The primary process's ``JobReturn`` on disk (``<attempt>/return.pkl``): written by the rank, read by whoever
concludes the job (the launcher, a detached supervisor, a SLURM job's own last step, the Ray driver).

The file is two pickles: the JobReturn without its configs (the value, the status, the overrides), then its
``(cfg, hydra_cfg)``. The configs are most of the file and of the time to read it (tens of milliseconds: Hydra's
whole config), and concluding a job needs only the value, so they are unpickled when something asks for them: a
sweep's launcher reads every job's return while the others still run, on the same cores. A file of one pickle (an
mmt before this one) reads as it was written.
"""

from typing import Any, Optional, Tuple

import cloudpickle
from hydra.core.utils import JobReturn


def dumps(ret: JobReturn) -> bytes:
    """The file's content; ``ret`` is left as it was. A value that cannot be pickled travels as its text."""
    configs = (ret.cfg, ret.hydra_cfg)
    ret.cfg = ret.hydra_cfg = None
    try:
        try:
            head = cloudpickle.dumps(ret)
        except Exception as exc:  # noqa: BLE001 - a value's own __reduce__ may raise anything: keep its text
            ret.return_value = f"<unpicklable {type(ret._return_value).__name__}: {exc}> {ret._return_value!r}"
            head = cloudpickle.dumps(ret)
    finally:
        ret.cfg, ret.hydra_cfg = configs
    return head + cloudpickle.dumps(configs)


def load(handle: Any) -> JobReturn:
    """The JobReturn in an open file of :func:`dumps`."""
    head = cloudpickle.load(handle)
    configs = handle.read()
    return LazyConfigsReturn(head, configs) if configs else head


class LazyConfigsReturn(JobReturn):
    """A JobReturn whose ``cfg`` and ``hydra_cfg`` are unpickled on first use (of either)."""

    def __init__(self, head: JobReturn, configs: bytes) -> None:
        self.__dict__.update({k: v for k, v in vars(head).items() if k not in ("cfg", "hydra_cfg")})
        self._configs: Optional[bytes] = configs
        self._loaded: Tuple[Any, Any] = (None, None)

    def _load(self) -> Tuple[Any, Any]:
        if self._configs is not None:
            self._loaded, self._configs = tuple(cloudpickle.loads(self._configs)), None
        return self._loaded

    @property
    def cfg(self) -> Any:
        return self._load()[0]

    @cfg.setter
    def cfg(self, value: Any) -> None:
        self._loaded = (value, self._load()[1])

    @property
    def hydra_cfg(self) -> Any:
        return self._load()[1]

    @hydra_cfg.setter
    def hydra_cfg(self, value: Any) -> None:
        self._loaded = (self._load()[0], value)
