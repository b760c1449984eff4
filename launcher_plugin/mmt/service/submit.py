"""Running one command job the way Lightning's ``lightning mmt run`` / ``Job.run`` do, for the ``mmt`` CLI and the SDK.

The job's config is composed with Hydra from the config shipped with mmt (``mmt/conf/run.yaml``: the machine
catalogue, the cluster settings, and the project's own ``conf/`` when there is one, for site clusters), without
touching the caller's Hydra (``mmt.service.compose``), then goes through the same planning, validation, dry run,
engine and backends as a Hydra app's ``python train.py -m``.
"""

import math
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from mmt.core.errors import ConfigError
from mmt.launching import engine, prepare
from mmt.launching.console import Console
from mmt.launching.session import Detached, DryRun, LaunchSession, SessionSettings
from mmt.planning.machine import canonical_name
from mmt.service import compose

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(sec|min|s|m|h|d)")
DURATION_EXPECTED = "expected a duration > 0: seconds (3600), or with units: 90s, 90m, 1h, 1h30m, 2d"


def max_runtime_s(key: str, value: Any) -> float:
    """A job's time limit in seconds: a number of seconds (Lightning's ``max_runtime``) or a duration with units
    ("90m", "1h30m", "3600s"); ConfigError naming ``key`` for anything else, zero or less included."""
    seconds: Optional[float] = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        if re.fullmatch(r"[+-]?\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif text and re.fullmatch(rf"(?:{_DURATION_PART.pattern}\s*)+", text):
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _DURATION_PART.findall(text))
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(key, value, DURATION_EXPECTED)
    return seconds


def no_task(_cfg: Any) -> None:
    """The task function of a command job (the command replaces it; Hydra's run_job still wants one)."""


@dataclass
class RunSpec:
    """One command job, in Lightning's terms where they apply."""

    command: str
    name: Optional[str] = None
    num_machines: int = 1
    machine: str = "cpu"
    image: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    env_from: List[str] = field(default_factory=list)
    cluster: str = "local"
    devices: Optional[int] = None
    command_mode: str = "per_node"
    timeout_min: Optional[float] = None
    # restarts after a failure (hydra.launcher.max_restarts); None: the config's
    max_restarts: Optional[int] = None
    dry_run: bool = False
    detach: bool = False
    # more Hydra overrides (site settings: hydra.launcher.partition=gpu ...)
    overrides: List[str] = field(default_factory=list)
    # the jobs it starts after (hydra.launcher.after): registered job names or launch names
    after: List[str] = field(default_factory=list)


def default_name() -> str:
    """Lightning's default (``mmt-<Mon-DD-HH_MM>``), made unique: several runs can start in one minute."""
    return time.strftime("mmt-%b-%d-%H_%M-") + os.urandom(2).hex()


def literal(value: str) -> str:
    r"""``value`` as OmegaConf text that resolves to itself: shell syntax (``${VAR}``, ``${VAR:-x}``) is not an
    interpolation. OmegaConf reads ``\${`` as a literal ``${``, and n backslashes before it as n/2 (so 2n+1)."""
    return re.sub(r"(\\*)\$\{", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", value)


def _quote(value: str) -> str:
    """A value as one Hydra override token that reaches the composed config byte for byte: a quoted value, where
    Hydra escapes a quote and the backslashes right before a quote or the end, and nothing else."""
    value = literal(value)
    value = re.sub(r"(\\*)'", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "'", value)
    value = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, value)
    return "'" + value + "'"


def _overrides(spec: RunSpec, name: str) -> List[str]:
    overrides = [
        f"machine={canonical_name(spec.machine)}",
        f"cluster={spec.cluster}",
        f"num_nodes={spec.num_machines}",
        f"command={_quote(spec.command)}",
        f"command_mode={spec.command_mode}",
        f"hydra.launcher.name={name}",
    ]
    if spec.devices is not None:
        overrides.append(f"devices={spec.devices}")
    if spec.image is not None:
        overrides.append(f"image={_quote(spec.image)}")
    if spec.timeout_min is not None:
        overrides.append(f"hydra.launcher.timeout_min={spec.timeout_min}")
    if spec.max_restarts is not None:
        overrides.append(f"hydra.launcher.max_restarts={spec.max_restarts}")
    if spec.env_from:
        overrides.append("hydra.launcher.env_from=[" + ",".join(spec.env_from) + "]")
    if spec.dry_run:
        overrides.append("hydra.launcher.dry_run=true")
    if spec.after:
        overrides.append("hydra.launcher.after=[" + ",".join(spec.after) + "]")
    return overrides + list(spec.overrides)


def _literal_values(spec: RunSpec) -> Any:
    """Set the job's command and env in its composed config as given (any character, no override grammar), kept
    literal: OmegaConf would read ``${...}`` as an interpolation, and the launcher's ``command`` field reads the
    app's through one more resolution (``oc.select``), so the command is set on the launcher itself."""
    from omegaconf import open_dict

    def amend(config: Any) -> None:
        with open_dict(config):
            config.env = {key: literal(str(value)) for key, value in spec.env.items()}
            config.hydra.launcher.command = literal(spec.command)

    return amend


def _check(spec: RunSpec) -> None:
    if not isinstance(spec.command, str) or not spec.command.strip():
        raise ConfigError("command", spec.command, "expected a shell command", "e.g. --command 'python train.py'")
    for key in spec.env:
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ConfigError(
                f"env.{key}", "***", "environment variable names are letters, digits and _", "e.g. -e MY_FLAG=1"
            )
    if spec.name is not None:
        prepare.check_name("name", spec.name)


# the planner's keys for what a RunSpec sets -> (the RunSpec's and SDK's name, the value the spec set, the value to
# show, a hint in those terms or None to keep the planner's): an error is reported in the caller's terms, not the
# config's (a CLI user typed --num-machines, not num_nodes)
_SPEC_KEYS: Dict[str, Tuple[str, Callable[[RunSpec], Any], Callable[[Any], Any], Optional[str]]] = {
    "num_nodes": ("num_machines", lambda s: s.num_machines, lambda v: v, "machines per job, e.g. num_machines=2"),
    "devices": ("devices", lambda s: s.devices, lambda v: v, "processes per machine, e.g. devices=2"),
    "command_mode": ("command_mode", lambda s: s.command_mode, lambda v: v, "per_node or per_rank"),
    "hydra.launcher.timeout_min": (
        "max_runtime",
        lambda s: s.timeout_min,
        lambda v: float(f"{v * 60:.6g}") if isinstance(v, (int, float)) else v,
        "seconds, or a duration such as 90m or 2h",
    ),
    "image": ("image", lambda s: s.image, lambda v: v, None),
    "hydra.launcher.max_restarts": (
        "max_restarts",
        lambda s: s.max_restarts,
        lambda v: v,
        "restarts after a failure, e.g. --max-restarts 3",
    ),
}


def _in_spec_terms(exc: ConfigError, spec: RunSpec) -> ConfigError:
    """The planner's error about a value the spec set, in the spec's names (an error about a value given some
    other way, a --set override, keeps the planner's names: that is what was typed)."""
    mapped = _SPEC_KEYS.get(exc.key)
    if mapped is None:
        return exc
    name, given, shown, hint = mapped
    try:
        same = given(spec) is not None and given(spec) == exc.value
    except Exception:  # noqa: BLE001  (values of any type: a mismatch means no mapping)
        same = False
    if not same:
        return exc
    return ConfigError(name, shown(exc.value), exc.expected, hint if hint is not None else exc.hint)


def run(spec: RunSpec, console: Optional[Console] = None) -> Union[engine.LaunchReport, List[engine.Submitted], str]:
    """Plan and start the job: a dry run's text, the submitted job (detached), or the report of the attached run.
    The job is composed, planned and handed over in Hydra's global state of its own: the caller's (a Hydra app's
    that calls the SDK) is as it was after it, whether it returned or raised (``mmt.service.compose``)."""
    _check(spec)
    name = spec.name or default_name()
    with compose.composed(_overrides(spec, name)) as (context, master):
        settings = replace(
            SessionSettings.of(master.hydra.launcher, Path(str(master.hydra.sweep.dir)).absolute()), detach=spec.detach
        )
        settings.refuse_what_cannot_be_done("run")  # before anything is planned: the two flags cannot go together
        backend = prepare.make_backend(master.hydra.launcher)
        try:
            try:
                job = prepare.prepare_job(
                    hydra_context=context,
                    master=master,
                    task_function=no_task,
                    backend=backend,
                    overrides=list(master.hydra.overrides.task),
                    num=0,
                    name=name,
                    amend=_literal_values(spec),
                )
            except ConfigError as exc:
                mapped = _in_spec_terms(exc, spec)
                if mapped is exc:
                    raise
                raise mapped from None
            outcome = LaunchSession(backend, settings, what="run").run([job.prepared], console=console)
            if isinstance(outcome, DryRun):
                return outcome.renders[0]
            if isinstance(outcome, Detached):
                return outcome.submitted
            return outcome.report
        finally:
            backend.close()


def exit_code(report: engine.LaunchReport) -> int:
    """An attached run's exit status: 0 when every job completed, 128+signal when interrupted, else 1."""
    if report.interrupted_by is not None and not report.detached:
        return 128 + report.interrupted_by
    return 0 if report.jobs and all(j.outcome.status.value == "COMPLETED" for j in report.jobs) else 1
