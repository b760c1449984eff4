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
does not have (mmt never pulls: N nodes pulling at once is not a launch), a mount source that is missing, and an
image without what mmt will run in it: for a command ``sh`` and ``sleep`` (the node's container waits in
``sleep infinity``), for the task function ``python3`` of the launcher's minor version (the task function travels
pickled) and the libraries its ranks import there (mmt's own runtime and the job's preload). What an image holds is
asked of the image itself in one container (its shell, and its python3), once per image: the answer is kept by
image id in ``$MMT_HOME/images.json``.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from omegaconf import OmegaConf

from mmt.agent.containers import JOB_LABEL, NodeContainer
from mmt.backends.mounts import MountSyntax, parse_mount, split_mount
from mmt.core.errors import ConfigError
from mmt.core.jobdir import read_json, write_atomic
from mmt.core.snapshot import binds as snapshot_binds
from mmt.planning import validate as check
from mmt.planning.plan import JobPlan
from mmt.records.registry import home

RUNTIMES = ("podman", "docker")
# how each runtime removes a set of containers in one `rm -f` (mmt.agent.containers runs it), even when some are gone
# already: podman waits 10 s for a container's init to stop by default, and the ranks are already stopped, so it
# kills at once (-t 0); and podman 4's `rm -f a b` removes none of the names when one of them is gone (a node
# agent's container that removed itself, --rm): --ignore makes it remove the rest. docker's rm -f kills at once and
# removes every name it finds (it has no --ignore)
_REMOVE_FLAGS: Dict[str, Tuple[str, ...]] = {"podman": ("-t", "0", "--ignore"), "docker": ()}
_INSTALL = {
    "podman": "apt-get install podman, or your distribution's package",
    "docker": "https://docs.docker.com/engine/install/",
}
# where the host's mmt is mounted in a task-function container
MMT_MOUNT = "/opt/mmt"
_PROBE_TIMEOUT_S = 120.0
# container_mounts as both runtimes' -v takes them
_MOUNTS = MountSyntax(
    expected="a bind mount SRC:DST[:OPTIONS] with DST an absolute path in the container",
    hint="e.g. hydra.launcher.container_mounts=[/data:/data:ro]",
    max_parts=3,
    absolute_target=True,
)
# what every rank of the task function imports in the image besides the job's preload: mmt's own runtime (the module,
# and the distribution that installs it)
RUNTIME_MODULES = {"hydra": "hydra-core", "omegaconf": "omegaconf", "cloudpickle": "cloudpickle"}
# asked of every image along with those, so that the recipes' preload is answered by the image's first probe
_ALSO_ASKED = ("torch", "lightning")


@dataclass(frozen=True)
class ContainerSettings:
    """``hydra.launcher.container_runtime`` and ``container_mounts`` of the local backend, validated."""

    runtime: str = "podman"
    mounts: Tuple[str, ...] = ()

    @property
    def remove_flags(self) -> Optional[Tuple[str, ...]]:
        """The flags with which this runtime's ``rm -f`` removes a set of containers, some perhaps gone already."""
        return _REMOVE_FLAGS.get(Path(self.runtime).name)

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
    return parse_mount(value, _MOUNTS)


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
        source = split_mount(mount).source
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
    facts = _image_facts(runtime, plan.image, _asked(plan))
    if facts == MISSING:
        found.append(
            ConfigError(
                "image",
                plan.image,
                f"{runtime} has no such image on this host (mmt does not pull: every node would pull it at once)",
                f"pull or build it first: {runtime} pull {plan.image}",
            )
        )
    elif isinstance(facts, ImageFacts):
        found += facts.problems(plan, runtime)
    return found


@dataclass(frozen=True)
class ImageFacts:
    """What an image holds of what mmt runs in it, as the image's own shell and python3 answered."""

    # ``sh`` runs in it (a command runs through ``sh -c``)
    shell: bool = False
    # ``sleep`` is on its PATH (a command's node container waits in ``sleep infinity``); None: unknown (no shell)
    sleep: Optional[bool] = None
    # ``python3`` is on its PATH, and its version (``3.11``; None when it is missing or did not run)
    python_found: bool = False
    python: Optional[str] = None
    implementation: str = ""
    # module -> whether its python3 finds it (without importing it)
    modules: Mapping[str, bool] = field(default_factory=dict)

    def problems(self, plan: JobPlan, runtime: str) -> List[ConfigError]:
        """Why this job cannot run in the image: the first cause mmt would meet, or none."""
        image = plan.image
        if plan.command is not None:
            if not self.shell:
                return [
                    ConfigError(
                        "image",
                        image,
                        "it has no sh, which runs the command in each node's container (exec ... sh -c <command>)",
                        "use an image with /bin/sh, or run the task function in it (no command=)",
                    )
                ]
            if not self.sleep:
                return [
                    ConfigError(
                        "image",
                        image,
                        "it has no sleep, which keeps each node's container running while the ranks' commands are "
                        "exec-ed into it (--entrypoint sleep <image> infinity)",
                        "use an image that has sleep on its PATH (coreutils or busybox: e.g. apt-get install "
                        "coreutils, or apk add busybox, in its Dockerfile)",
                    )
                ]
            return []
        ours = f"{sys.version_info.major}.{sys.version_info.minor}"
        if not self.python_found:
            return [
                ConfigError(
                    "image",
                    image,
                    "it has no python3, which runs the task function in it (mmt and the app are mounted from "
                    "this host)",
                    f"use an image with python3 {ours}, torch and Lightning, or run a command in it with command=...",
                )
            ]
        if self.python is None:
            return [
                ConfigError(
                    "image",
                    image,
                    "its python3 does not run (it exited with an error when asked its version)",
                    f"see why: {runtime} run --rm --entrypoint python3 {image} -V; or use an image with python3 {ours}",
                )
            ]
        if self.python != ours:
            other = self.implementation and self.implementation != sys.implementation.name
            theirs = self.python + (f" ({self.implementation})" if other else "")
            return [
                ConfigError(
                    "image",
                    image,
                    f"its python3 is {theirs}, the launcher's is {ours}: the task function travels pickled, so the "
                    "two must be the same minor version",
                    f"use an image with Python {ours}, run the launcher with Python {self.python}, or run a command "
                    "in the image with command=...",
                )
            ]
        missing = [name for name in _needed(plan) if not self.modules.get(name, True)]
        if missing:
            names = ", ".join(RUNTIME_MODULES.get(name, name) for name in missing)
            return [
                ConfigError(
                    "image",
                    image,
                    f"its python3 {self.python} has no {names}, which the task function's ranks import in it "
                    "(mmt's own runtime: hydra-core, omegaconf, cloudpickle; and the job's preload)",
                    f"install them in the image (pip install {' '.join(RUNTIME_MODULES.get(n, n) for n in missing)})",
                )
            ]
        return []

    def to_json(self) -> Dict[str, Any]:
        return {
            "shell": self.shell,
            "sleep": self.sleep,
            "python_found": self.python_found,
            "python": self.python,
            "implementation": self.implementation,
            "modules": dict(self.modules),
        }

    @classmethod
    def from_json(cls, value: Any) -> Optional["ImageFacts"]:
        """The facts kept for an image, or None where they are not facts of this shape (an older mmt's: ask again)."""
        if not isinstance(value, dict) or set(value) != set(cls().to_json()):
            return None
        modules = value["modules"]
        typed = (
            isinstance(value["shell"], bool)
            and isinstance(value["sleep"], (bool, type(None)))
            and isinstance(value["python_found"], bool)
            and isinstance(value["python"], (str, type(None)))
            and isinstance(value["implementation"], str)
            and isinstance(modules, dict)
            and all(isinstance(k, str) and isinstance(v, bool) for k, v in modules.items())
        )
        if not typed:
            return None
        return cls(
            shell=value["shell"],
            sleep=value["sleep"],
            python_found=value["python_found"],
            python=value["python"],
            implementation=value["implementation"],
            modules=dict(modules),
        )


def _needed(plan: JobPlan) -> Tuple[str, ...]:
    """The modules the task function's ranks import from the image: mmt's own runtime, and the top-level package of
    every preload entry that the mounts do not bring (mmt itself, the project's and the app's own packages)."""
    names = dict.fromkeys(RUNTIME_MODULES)
    cwd = os.getcwd()
    mounted = [cwd, _app_dir(cwd), *plan.env.get("PYTHONPATH", "").split(os.pathsep)]
    for entry in plan.preload:
        top = entry.split(".")[0]
        if top and top != "mmt" and not any(_provides(folder, top) for folder in mounted if folder):
            names[top] = None
    return tuple(names)


def _provides(folder: str, module: str) -> bool:
    base = Path(folder)
    return (base / module).is_dir() or (base / f"{module}.py").is_file() or any(base.glob(f"{module}.*.so"))


def _asked(plan: JobPlan) -> Tuple[str, ...]:
    """The modules to ask the image about: the same for a command, so that the answer serves the task function too."""
    return tuple(sorted({*RUNTIME_MODULES, *_ALSO_ASKED, *(_needed(plan) if plan.command is None else ())}))


MISSING = "missing"
# the exit status of `podman run` and `docker run` whose program the runtime could not run: not there (127), not
# executable (126); and the runtime's own failure (125)
_NOT_RUN = (126, 127)
_RUNTIME_FAILED = 125
_MARK = "mmt-image-fact"
# what the image's python3 says, whichever version it is (no f-strings: an old python3 still answers): its version
# and implementation, and which of the modules named on its command line it finds, without importing any
_PYTHON_PROBE = f"""import sys
impl = getattr(getattr(sys, "implementation", None), "name", "cpython")
print("{_MARK} python %d.%d %s" % (sys.version_info[0], sys.version_info[1], impl))
try:
    from importlib.util import find_spec
except ImportError:
    find_spec = None
for name in sys.argv[1:]:
    try:
        found = find_spec is not None and find_spec(name) is not None
    except Exception:
        found = False
    print("{_MARK} module %s %s" % (name, "yes" if found else "no"))
"""
# what the image's sh says: that it runs, whether sleep is a program on its PATH (a shell's builtin is not: the
# runtime runs the container's entrypoint), and its python3's answer (the modules are the script's arguments)
_SHELL_PROBE = f"""echo "{_MARK} shell yes"
case "$(command -v sleep)" in /*) echo "{_MARK} sleep yes" ;; *) echo "{_MARK} sleep no" ;; esac
if command -v python3 >/dev/null 2>&1; then
    python3 -c {shlex.quote(_PYTHON_PROBE)} "$@" || echo "{_MARK} python-failed"
else
    echo "{_MARK} no-python"
fi
"""


def parse_facts(output: str, python_found: Optional[bool] = None) -> ImageFacts:
    """The facts in a probe's output (:data:`_SHELL_PROBE`'s, or :data:`_PYTHON_PROBE`'s alone for an image without
    a shell, whose python3 is then ``python_found``); lines that are not the probe's are ignored."""
    said: Dict[str, List[str]] = {}
    modules: Dict[str, bool] = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != _MARK:
            continue
        if words[1] == "module" and len(words) == 4:
            modules[words[2]] = words[3] == "yes"
        else:
            said[words[1]] = words[2:]
    version = said.get("python")
    shell = said.get("shell") == ["yes"]
    return ImageFacts(
        shell=shell,
        sleep=said["sleep"] == ["yes"] if "sleep" in said else None,
        python_found=bool(version) or ("python-failed" in said) or (bool(python_found) and not shell),
        python=version[0] if version and re.fullmatch(r"\d+\.\d+", version[0]) else None,
        implementation=version[1] if version and len(version) > 1 else "",
        modules=modules,
    )


@lru_cache(maxsize=None)
def _image_facts(runtime: str, image: str, modules: Tuple[str, ...]) -> Union[str, ImageFacts, None]:
    """:data:`MISSING`, the image's facts, or None where the runtime did not answer (nothing is refused then): asked
    once per image and launch. Asking the image needs a container, a few tenths of a second: the answer is kept by
    image id in ``$MMT_HOME`` (an image id is its content), so a launch of the same image only asks whether it is
    there; an image is asked again only for a module it was never asked about (another preload)."""
    try:
        present = subprocess.run(
            [runtime, "image", "inspect", "--format", "{{.Id}}", image],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return MISSING
    if present.returncode != 0:
        return MISSING
    known = _known_images()
    key = f"{runtime}:{present.stdout.strip()}"
    facts = ImageFacts.from_json(known.get(key))
    if facts is not None and (facts.python is None or all(name in facts.modules for name in modules)):
        return facts  # (an image without a working python3 has no modules to ask about)
    asked = tuple(sorted({*modules, *(facts.modules if facts is not None else ())}))
    facts = _ask_image(runtime, image, asked)
    if facts is not None:
        known[key] = facts.to_json()
        _keep_known_images(known)
    return facts


def _ask_image(runtime: str, image: str, modules: Tuple[str, ...]) -> Optional[ImageFacts]:
    """The image's facts from one container: its sh, and through it its python3. An image without a shell is asked
    its python3's answer alone (a second container, for such images only). None: the runtime did not answer."""
    run = [runtime, "run", "--rm", "--pull=never", "--network=none"]
    try:
        shell = subprocess.run(
            [*run, "--entrypoint", "sh", image, "-c", _SHELL_PROBE, "sh", *modules],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
        facts = parse_facts(shell.stdout)
        if facts.shell:
            return facts
        if shell.returncode not in _NOT_RUN:
            return None  # the runtime failed, not the image's sh: nothing to keep
        python = subprocess.run(
            [*run, "--entrypoint", "python3", image, "-c", _PYTHON_PROBE, *modules],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if python.returncode == _RUNTIME_FAILED:
        return None
    return parse_facts(python.stdout, python_found=python.returncode not in _NOT_RUN)


def _known_images_file() -> Path:
    return home() / "images.json"


def _known_images() -> Dict[str, Any]:
    noted = read_json(_known_images_file())
    return {str(k): v for k, v in noted.items()} if isinstance(noted, dict) else {}


def _keep_known_images(known: Dict[str, Any]) -> None:
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
    binds = [f"{p}:{p}" for p in found] + snapshot_binds(plan.snapshot)
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
    return NodeContainer(
        runtime=settings.runtime,
        name=name,
        node_rank=node_rank,
        run_argv=(*argv, "infinity"),
        remove_flags=settings.remove_flags,
    )


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
    return NodeContainer(
        runtime=settings.runtime,
        name=name,
        node_rank=node_rank,
        run_argv=tuple(argv),
        remove_flags=settings.remove_flags,
    )


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
