"""A local job with an ``image``: each simulated node in a container of its own, through podman or docker.

Both CLIs share the command lines used here: ``run --rm --network=host --label ... -v ...`` for a node (the host
network keeps ``MASTER_ADDR`` valid), ``exec -e NAME ... -w DIR`` into it. What runs depends on the job's shape:

* **a command** (``command=...``, ``mmt run --command``): the image brings everything; mmt's process for the rank
  runs on this host as for any command, and its command runs in the node's container (``exec ... sh -c``) with the
  rank contract, so mmt need not be in the image;
* **the task function**: the image brings Python and the libraries (torch, Lightning, hydra-core, omegaconf,
  cloudpickle); mmt and the app come from the host, mounted. The container's one process is mmt's node agent in
  the image's Python (``python3 -m mmt.agent.node``), which imports the job's preload once and forks the node's
  ranks, as on SLURM.

Bad input is refused before anything starts, naming the key: a runtime that is not installed, an image the runtime
does not have (mmt never pulls: N nodes pulling at once is not a launch), a mount source that is missing, an image
without ``python3`` for the task function. The image facts are asked once per image and launch.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

from omegaconf import OmegaConf

from mmt.agent.containers import JOB_LABEL, NodeContainer
from mmt.core.errors import ConfigError
from mmt.core.jobdir import read_json, write_atomic
from mmt.planning import validate as check
from mmt.planning.plan import JobPlan
from mmt.records.registry import home

RUNTIMES = ("podman", "docker")
_INSTALL = {
    "podman": "apt-get install podman, or your distribution's package",
    "docker": "https://docs.docker.com/engine/install/",
}
# where the host's mmt is mounted in a task-function container
MMT_MOUNT = "/opt/mmt"
_PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ContainerSettings:
    """``hydra.launcher.container_runtime`` and ``container_mounts`` of the local backend, validated."""

    runtime: str = "podman"
    mounts: Tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: Any) -> "ContainerSettings":
        runtime = OmegaConf.select(cfg, "container_runtime", default="podman")
        runtime = getattr(runtime, "value", runtime)
        mounts = OmegaConf.select(cfg, "container_mounts", default=None) or []
        return cls(
            runtime=check.choice("hydra.launcher.container_runtime", runtime, RUNTIMES),
            mounts=tuple(_mount(m) for m in mounts),
        )


def _mount(value: Any) -> str:
    text = check.one_line("hydra.launcher.container_mounts", str(value))
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]) or not parts[1].startswith("/"):
        raise ConfigError(
            "hydra.launcher.container_mounts",
            text,
            "a bind mount SRC:DST[:OPTIONS] with DST an absolute path in the container",
            "e.g. hydra.launcher.container_mounts=[/data:/data:ro]",
        )
    return text


def problems(plan: JobPlan, settings: ContainerSettings) -> List[ConfigError]:
    """Why this job's image cannot run here, one error per cause, cheapest first; empty when it can."""
    if plan.image is None:
        return []
    runtime = settings.runtime
    if shutil.which(runtime) is None:
        return [
            ConfigError(
                "hydra.launcher.container_runtime",
                runtime,
                f"{runtime} is not installed on this host (a job with an image runs each node in a container)",
                f"install it ({_INSTALL[runtime]}), choose the other runtime "
                f"(hydra.launcher.container_runtime={'docker' if runtime == 'podman' else 'podman'}), or drop image=",
            )
        ]
    found = []
    for mount in settings.mounts:
        source = mount.split(":")[0]
        if not os.path.exists(source):
            found.append(
                ConfigError(
                    "hydra.launcher.container_mounts",
                    mount,
                    f"its source {source} does not exist on this host",
                    "create it, or fix the path",
                )
            )
    if plan.machine.gpus:
        found.append(
            ConfigError(
                "image",
                plan.image,
                f"cluster=local does not pass GPUs into containers (machine={plan.machine.name} has GPUs)",
                "run it without image= here, or on cluster=slurm with pyxis, apptainer or oci",
            )
        )
    facts = _image_facts(runtime, plan.image)
    if facts == "missing":
        found.append(
            ConfigError(
                "image",
                plan.image,
                f"{runtime} has no such image on this host (mmt does not pull: every node would pull it at once)",
                f"pull or build it first: {runtime} pull {plan.image}",
            )
        )
    elif plan.command is None and facts == "no-python":
        found.append(
            ConfigError(
                "image",
                plan.image,
                "it has no python3, which runs the task function in it (mmt and the app are mounted from this host)",
                "use an image with python3, torch and Lightning, or run a command in it with command=...",
            )
        )
    return found


@lru_cache(maxsize=None)
def _image_facts(runtime: str, image: str) -> str:
    """``missing``, ``no-python`` or ``ok``: asked of the runtime once per image and launch. Whether an image has
    python3 needs a container, a few tenths of a second: the answer is kept by image id in ``$MMT_HOME`` (an image
    id is its content), so a launch of the same image only asks whether it is there."""
    try:
        present = subprocess.run(
            [runtime, "image", "inspect", "--format", "{{.Id}}", image],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
        if present.returncode != 0:
            return "missing"
        known = _known_images()
        key = f"{runtime}:{present.stdout.strip()}"
        if key not in known:
            python = subprocess.run(
                [runtime, "run", "--rm", "--pull=never", "--network=none", "--entrypoint", "python3", image, "-c", ""],
                capture_output=True,
                timeout=_PROBE_TIMEOUT_S,
            )
            known[key] = "ok" if python.returncode == 0 else "no-python"
            _keep_known_images(known)
        return known[key]
    except (OSError, subprocess.TimeoutExpired):
        return "missing"


def _known_images_file() -> Path:
    return home() / "images.json"


def _known_images() -> Dict[str, str]:
    noted = read_json(_known_images_file())
    return {str(k): str(v) for k, v in noted.items()} if isinstance(noted, dict) else {}


def _keep_known_images(known: Dict[str, str]) -> None:
    try:
        _known_images_file().parent.mkdir(parents=True, exist_ok=True)
        write_atomic(_known_images_file(), json.dumps(known).encode())
    except OSError:  # a read-only home: asked again next time
        pass


def container_name(job_id: str, attempt_id: str, node_rank: int, restart: int = 0) -> str:
    """A valid container name (``[a-zA-Z0-9][a-zA-Z0-9_.-]*``), unique per job, attempt, node and restart: a restart
    never waits for the runtime to finish removing the run before (``--rm`` is asynchronous; a loaded host was still
    removing it when the restart asked for the same name)."""
    name = f"mmt-{job_id}-{attempt_id}-n{node_rank}" + (f"-r{restart}" if restart else "")
    return re.sub(r"[^a-zA-Z0-9_.<>-]", "-", name)


def mounts(plan: JobPlan, settings: ContainerSettings, cwd: str) -> List[str]:
    """What every node's container sees of this host: the job dir and the project dir (at the same paths), the
    user's mounts, and for the task function mmt itself and the app's own folder."""
    paths = [plan.job_dir, cwd, *([_app_dir(cwd)] if plan.command is None else [])]
    found: List[str] = []
    for path in paths:
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in found):
            found.append(path)
    binds = [f"{p}:{p}" for p in found]
    if plan.command is None:
        binds += [f"{source}:{MMT_MOUNT}/{name}:ro" for name, source in _mmt_packages().items()]
    return binds + list(settings.mounts)


def _mmt_packages() -> Dict[str, str]:
    """mmt's own packages on this host (mounted read-only into a task-function container)."""
    return {"mmt": str(Path(__file__).resolve().parents[2])}  # mmt/backends/local/images.py


def _app_dir(cwd: str) -> str:
    """The folder of the app the launcher runs (its modules travel by reference in the payload), else ``cwd``."""
    app_dir = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    return app_dir if app_dir and os.path.isdir(app_dir) else cwd


def python_path(cwd: str) -> str:
    return os.pathsep.join(dict.fromkeys([MMT_MOUNT, cwd, _app_dir(cwd)]))


def node_container(plan: JobPlan, settings: ContainerSettings, name: str, node_rank: int, cwd: str) -> NodeContainer:
    """A node's container that only waits (``-d``, ``sleep infinity``): each of its processes is an exec into it."""
    argv = [*_run(plan, settings, name, node_rank, cwd, detached=True), "--entrypoint", "sleep", str(plan.image)]
    return NodeContainer(runtime=settings.runtime, name=name, node_rank=node_rank, run_argv=(*argv, "infinity"))


def node_agent_container(
    plan: JobPlan, settings: ContainerSettings, name: str, node_rank: int, cwd: str, node_run: str
) -> NodeContainer:
    """A node's container whose one process is mmt's node agent, attached (its exit status is the node's, the
    runtime passes SIGTERM on to it); it forks the node's ranks. Its environment holds no secret (the ranks' is in
    ``node_run``, a private file), so it is given by value; nor the job's tag, which only its ranks carry (a node
    agent stops whatever carries it once its ranks are gone)."""
    # the ranks' PYTHONPATH: the agent imports their preload, and they are forked from it
    env = container_env({k: v for k, v in plan.env.items() if k == "PYTHONPATH"}, plan, cwd)
    argv = _run(plan, settings, name, node_rank, cwd, detached=False)
    argv += ["-w", cwd, *[arg for key in sorted(env) for arg in ("-e", f"{key}={env[key]}")]]
    argv += ["--entrypoint", "python3", str(plan.image), "-u", "-m", "mmt.agent.node", node_run]
    return NodeContainer(runtime=settings.runtime, name=name, node_rank=node_rank, run_argv=tuple(argv))


def _run(plan: JobPlan, settings: ContainerSettings, name: str, node_rank: int, cwd: str, detached: bool) -> List[str]:
    # the host's network and hostname: MASTER_ADDR and the host name every rank resolves (gloo does) stay valid
    argv = [settings.runtime, "run", *(["-d"] if detached else []), "--rm", "--init", "--pull=never"]
    argv += ["--network=host", "--uts=host", "--name", name]
    argv += ["--label", f"{JOB_LABEL}={plan.job_id}", "--label", f"mmt.job_dir={plan.job_dir}"]
    argv += ["--label", f"mmt.node={node_rank}"]
    for bind in mounts(plan, settings, cwd):
        argv += ["-v", bind]
    return argv


def exec_prefix(settings: ContainerSettings, name: str, env: Mapping[str, str], cwd: str) -> List[str]:
    """``<runtime> exec`` into node ``name``, up to the program: the values of ``env`` are passed by name only (the
    runtime reads them from its own environment), so none is on a command line."""
    argv = [settings.runtime, "exec", "-w", cwd]
    for key in sorted(env):
        argv += ["-e", key]
    return [*argv, name]


def describe(plan: JobPlan, settings: ContainerSettings, cwd: str, env: Mapping[str, str]) -> List[str]:
    """The dry run's view: node 0's container and its first process, exactly as they will run (the attempt id is
    chosen at start)."""
    name = container_name(plan.job_id, "<attempt>", 0)
    if plan.command is None:  # the node agent is the container's process; it forks the ranks
        run = node_agent_container(plan, settings, name, 0, cwd, f"{plan.job_dir}/<attempt dir>/node.0.pkl")
        return [f"  container  {shlex.join(run.run_argv)}"]
    run = node_container(plan, settings, name, 0, cwd)
    first = [*exec_prefix(settings, name, env, cwd), "sh", "-c", plan.command]  # mmt's process for it runs here
    return [f"  container  {shlex.join(run.run_argv)}", f"  process 0  {shlex.join(first)}"]


def container_env(env: Dict[str, str], plan: JobPlan, cwd: str) -> Dict[str, str]:
    """A process's environment inside the container: the job's variables only (never the host's PATH or venv),
    with mmt on the task function's PYTHONPATH."""
    if plan.command is None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (python_path(cwd), env.get("PYTHONPATH")) if p)
    return env
