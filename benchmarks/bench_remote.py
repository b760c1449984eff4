"""What launching over SSH costs (docs/remote.md): the same launch from a "laptop" over SSH and on the login node,
alternating, on this host's SLURM test cluster.

    login  the launcher on the login node: SLURM's commands at hand, the sweep dir on the shared filesystem
    ssh    the launcher on a laptop that shares nothing with the cluster (its own mount namespace: the project, its
           sweeps and MMT_HOME in a tmpfs the cluster cannot see, the remote root out of its sight, no SLURM
           command), reaching the login node (OpenSSH on the loopback, started here) with hydra.launcher.ssh

(a) the 2 x 2 probe: python train.py -m cluster=slurm recipe=probe num_nodes=2 devices=2
(b) a sweep of 100 trivial jobs (benchmarks/sweep_app.py, +x=range(100), one job array)

Each is timed from the command's start to its exit (for ssh: the connection, the checks, the code synced when it
changed, the jobs handed over, the console followed, the records brought back), the variants alternate within each
round, and the medians are compared as ratios (ssh / login). Needs root (namespaces, sshd), Debian's
openssh-server and rsync, and the test cluster:

    scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"
    python benchmarks/bench_remote.py --rounds 7                 # both parts
    python benchmarks/bench_remote.py --part probe --rounds 9
"""

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List

from _timing import alternate, report, run, slurm_idle

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
sys.path.insert(0, str(REPO / "tests"))
from helpers.sshd import Laptop, LoginNode  # noqa: E402  (the tests' login node and laptop)


def _variants(
    part: str, scratch: Path, laptop: Laptop, project: Path, ssh: List[str]
) -> Dict[str, Callable[[Path], None]]:
    if part == "probe":
        login_cmd = [PY, "train.py", "-m", "cluster=slurm", "recipe=probe", "num_nodes=2", "devices=2"]
        laptop_cmd = list(login_cmd)
    else:
        login_cmd = [PY, "benchmarks/sweep_app.py", "-m", "hydra/launcher=mmt_slurm", "+x=range(100)"]
        laptop_cmd = [PY, "sweep_app.py", *login_cmd[2:]]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MMT_HOME"] = str(scratch / "login-home")

    def login(scratch: Path) -> None:
        run([*login_cmd, f"hydra.sweep.dir={tempfile.mkdtemp(prefix='login', dir=scratch)}"], cwd=REPO, env=env)

    count = [0]

    def over_ssh(scratch: Path) -> None:
        count[0] += 1
        done = laptop.run(
            [*laptop_cmd, *ssh, f"hydra.sweep.dir={project}/multirun/{part}{count[0]}"], cwd=project, timeout=900
        )
        if done.returncode != 0:
            raise SystemExit(f"ssh variant failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")

    return {"login": login, "ssh": over_ssh}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("probe", "sweep", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    node = LoginNode.create(scratch / "login").start()
    remote_root = scratch / "cluster"
    laptop = Laptop(scratch / "laptop", scratch / "laptop" / "home", hidden=[remote_root]).start()
    try:
        template = scratch / "template"
        template.mkdir()
        shutil.copy(REPO / "train.py", template / "train.py")
        shutil.copy(REPO / "benchmarks" / "sweep_app.py", template / "sweep_app.py")
        shutil.copytree(REPO / "conf", template / "conf")
        shutil.copytree(REPO / "recipes", template / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
        project = laptop.home / "project"
        laptop.run(["mkdir", "-p", str(project)]).check_returncode()
        laptop.copy_in(template, project)
        conf = os.environ.get("SLURM_CONF", "")
        ssh = node.ssh_settings(remote_root, PY, setup=[f"export SLURM_CONF={conf}"] if conf else [])
        parts = ("probe", "sweep") if args.part == "both" else (args.part,)
        for part in parts:
            times = alternate(_variants(part, scratch, laptop, project, ssh), args.rounds, scratch, settle=slurm_idle)
            print(f"\n({part}) {'2 x 2 probe' if part == 'probe' else 'sweep of 100 jobs'}")
            json_path = args.json.with_name(f"{args.json.stem}-{part}.json") if args.json else None
            report(times, {"ssh / login": ("ssh", "login")}, json_path, rounds=args.rounds, part=part)
    finally:
        laptop.close()
        node.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
