"""SLURM's own OCI containers (``hydra.launcher.container_runtime=oci``): ``srun --container <bundle>``, run by the
runtime the cluster's ``oci.conf`` names (SLURM 22.05 on).

``image=`` is an OCI bundle directory (``config.json`` and ``rootfs/``) that every node sees: SLURM copies nothing.
Each attempt gets a bundle of its own, derived from the image's (:func:`derive`), because SLURM takes its mounts, its
namespaces and its working dir from ``config.json`` alone: the job dir, the project dir and ``container_mounts``
bound in, the host's network and hostname (``MASTER_ADDR`` and the node names stay valid; ``/etc/hosts`` is the
node's), the project dir as the working dir. SLURM 22.05 ignores ``root.path`` and always runs ``<bundle>/rootfs``,
which runc refuses as a symlink: the derived ``rootfs`` is an empty skeleton onto which every top-level entry of the
image's rootfs is bound (no copy, no privilege: binds inside the container's user namespace).

Two shapes (SLURM 22.05 runs one container task per node, and gives it no per-task ``SLURM_*`` variables):

* the task function (no ``command``): srun's one task per node enters the container and runs mmt's node agent with
  the image's ``python3``, mmt and the app from the mounted project (as pyxis does); the agent forks the ranks there.
* a command (the image brings everything, mmt need not be in it): the node agent runs on the host, with the
  launcher's interpreter (a shared filesystem, as the job's own conclusion assumes), and each rank's command runs
  in a container of its own: ``srun --overlap --container`` a one-task step on the rank's node (:func:`rank_exec`),
  given the rank contract through srun's environment.
"""

import json
import os
import socket
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from mmt.backends.mounts import split_mount
from mmt.core.errors import ConfigError
from mmt.core.jobdir import write_atomic
from mmt.planning.plan import JobPlan

# the attempt's derived bundle: <attempt dir>/oci (config.json and the rootfs skeleton)
BUNDLE = "oci"
# where the task-function shape finds the image's python3 (srun runs `python3` from the PATH)
PYTHONS = ("usr/local/bin/python3", "usr/bin/python3", "bin/python3")
# what the runtime mounts itself (or, for /tmp, a tmpfs per container): never bound from the image
_OWN = {"proc", "dev", "sys", "tmp"}
_KEY = "image"
_MOUNTS = "hydra.launcher.container_mounts"


def image_problems(plan: JobPlan, mounts: Sequence[str], slurm_conf: Optional[str]) -> List[ConfigError]:
    """What makes an oci job fail on its nodes, found before anything is submitted: the bundle, its python3 (the
    task-function shape), the mounts' sources, and a cluster without oci.conf."""
    found: List[ConfigError] = []
    image = Path(plan.image or "")
    config = image / "config.json"
    hint = "image= is an OCI bundle dir that every node sees: config.json and rootfs/ (e.g. from `umoci unpack`)"
    if not image.is_absolute():
        found.append(ConfigError(_KEY, plan.image, "with container_runtime=oci, an absolute path", hint))
    elif not image.is_dir():
        found.append(ConfigError(_KEY, plan.image, "no such directory (an OCI bundle dir)", hint))
    elif not config.is_file() or not (image / "rootfs").is_dir():
        parts = (("config.json", config.is_file()), ("rootfs/", (image / "rootfs").is_dir()))
        missing = " and no ".join(name for name, there in parts if not there)
        found.append(ConfigError(_KEY, plan.image, f"not an OCI bundle: no {missing}", hint))
    else:
        try:
            json.loads(config.read_text())
        except (OSError, ValueError) as exc:
            found.append(ConfigError(_KEY, plan.image, f"its config.json cannot be read ({exc})", hint))
        if plan.command is None and not any((image / "rootfs" / p).exists() for p in PYTHONS):
            found.append(
                ConfigError(
                    _KEY,
                    plan.image,
                    "the task function runs in the image's python3, and its rootfs has none "
                    f"({', '.join('/' + p for p in PYTHONS)})",
                    "use an image with python3, torch and Lightning (mmt comes from the mounted project), or run "
                    "a command the image brings (command=...)",
                )
            )
    for mount in mounts:
        source = split_mount(mount).source
        if not os.path.exists(source):
            found.append(
                ConfigError(_MOUNTS, mount, f"its source {source} does not exist", "bind a path every node has")
            )
    problem = oci_conf_problem(slurm_conf)
    if problem is not None:
        found.append(problem)
    return found


def oci_conf_problem(slurm_conf: Optional[str]) -> Optional[ConfigError]:
    """SLURM reads oci.conf beside slurm.conf; without it every srun --container fails. Said only where this host
    has slurm.conf to look beside (a configless client has none)."""
    conf = Path(slurm_conf or "/etc/slurm/slurm.conf")
    if not conf.is_file() or (conf.parent / "oci.conf").is_file():
        return None
    return ConfigError(
        "hydra.launcher.container_runtime",
        "oci",
        f"the cluster has no oci.conf (beside {conf}): SLURM cannot run srun --container",
        "ask the site to configure it (SLURM >= 22.05: RunTimeQuery, RunTimeKill, RunTimeDelete and RunTimeRun with "
        '%b and a container id of %n.%u.%j.%s.%t, e.g. RunTimeRun="runc --rootless=true --root=/run/user/runc run '
        '%n.%u.%j.%s.%t --bundle %b"), or use container_runtime=pyxis or apptainer',
    )


def _bind(source: str, destination: str, readonly: bool = False) -> Dict[str, Any]:
    return {
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": ["rbind", "ro" if readonly else "rw"],
    }


def derive(plan: JobPlan, mounts: Sequence[str], project_dir: str, attempt_dir: Path) -> Path:
    """The attempt's bundle (``<attempt dir>/oci``): the image's config.json, made to run on SLURM 22.05 with the
    job's mounts (see the module's doc). Returns its dir."""
    image = Path(str(plan.image))
    config = json.loads((image / "config.json").read_text())
    rootfs = Path(os.path.realpath(image / "rootfs"))
    bundle = attempt_dir / BUNDLE
    skeleton = bundle / "rootfs"
    skeleton.mkdir(parents=True, exist_ok=True)
    spec = list(config.get("mounts") or [])
    taken = {str(m.get("destination", "")).rstrip("/") for m in spec}
    image_binds = []
    for entry in sorted(os.listdir(rootfs)):
        path, target = rootfs / entry, f"/{entry}"
        if entry in _OWN or target in taken:
            continue
        if path.is_symlink():  # /lib -> usr/lib: the same link in the skeleton
            link = skeleton / entry
            if not link.is_symlink():
                link.symlink_to(os.readlink(path))
            continue
        image_binds.append(_bind(str(path), target))
    job = [_bind(project_dir, project_dir), _bind(plan.job_dir, plan.job_dir)]
    for mount in mounts:
        bind = split_mount(mount)  # validated by SlurmSettings
        job.append(_bind(bind.source, bind.target, readonly=bind.readonly))
    if "/tmp" not in taken:
        spec.append(
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]}
        )
    if os.path.exists("/etc/hosts"):  # the node's names (MASTER_ADDR) as the node resolves them
        job.append({"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts", "options": ["bind", "ro"]})
    config["mounts"] = image_binds + spec + job
    config["root"] = {"path": "rootfs", "readonly": False}
    config.pop("hostname", None)  # the node's own: no UTS namespace
    linux = config.setdefault("linux", {})
    linux["namespaces"] = [n for n in linux.get("namespaces", []) if n.get("type") not in ("network", "uts")]
    process = config.setdefault("process", {})
    process["terminal"] = False
    process["cwd"] = project_dir
    write_atomic(bundle / "config.json", json.dumps(config, indent=1).encode())
    return bundle


def rank_exec(bundle: Path, node: str, job_id: str, slurm_conf: Optional[str]) -> List[str]:
    """What runs one rank's command in a container of its own (a command job): a one-task step on the rank's node,
    overlapping the node agent's step, in the job's bundle. The rank's environment (the contract) reaches the
    container through srun's (``--export=ALL``, SLURM's default); SLURM_* were taken out of it, so the job is named."""
    srun = [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        f"--container={bundle}",
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "--quiet",
    ]
    return ["env", f"SLURM_CONF={slurm_conf}", *srun] if slurm_conf else srun


def node_in_container(hosts: Sequence[str]) -> Optional[int]:
    """This task's node index inside a SLURM 22.05 container, which gets no SLURM_NODEID: where this host (the
    node's own name: the container shares its hostname) is in the step's node list."""
    name = socket.gethostname()
    for candidate in (name, name.split(".")[0]):
        if candidate in hosts:
            return list(hosts).index(candidate)
    return None
