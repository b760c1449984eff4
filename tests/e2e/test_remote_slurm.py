"""Launching on SLURM from a laptop over SSH (docs/remote.md), with real processes: an OpenSSH server on the
loopback started by the tests (helpers.sshd.LoginNode), the project's SLURM test cluster, and a "laptop" that
shares nothing with the cluster but the connection (helpers.sshd.Laptop): its project, sweeps and MMT_HOME are in a
tmpfs the cluster cannot see, the cluster's remote root is an empty tmpfs it cannot see into, and SLURM's commands
cannot run there. A launch that used a shared path, or a SLURM command on the laptop, fails these tests."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from omegaconf import OmegaConf

from helpers.paths import REPO
from helpers.processes import wait_until
from helpers.slurm import cluster_env, queued
from helpers.sshd import Laptop, LoginNode, skip_without_sshd

pytestmark = pytest.mark.slurm

PYTHON = sys.executable
FAST = ("hydra.launcher.poll_interval_s=0.5", "hydra.launcher.metrics_interval_s=0")

APP = """
import os
import time
from pathlib import Path

import hydra
from hydra.utils import to_absolute_path


@hydra.main(version_base="1.3", config_path="conf", config_name="app")
def main(cfg):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"rank {rank} of {world} on {os.environ['NODE_RANK']} says hello", flush=True)
    if cfg.gate:
        if rank == 0:
            Path(f"{cfg.gate}.started").touch()
        deadline = time.time() + 240
        while not Path(cfg.gate).exists() and time.time() < deadline:
            time.sleep(0.1)
    conf = to_absolute_path("conf/app.yaml")  # the laptop's project's file, as the job finds it there
    found = Path(conf).is_file()
    return {"loss": (cfg.x - 1.5) ** 2, "x": cfg.x, "world": world, "file": __file__, "conf": conf, "conf_there": found}


if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def login_node(tmp_path_factory):
    skip_without_sshd()
    node = LoginNode.create(tmp_path_factory.mktemp("login")).start()
    yield node
    node.stop()


@pytest.fixture
def site(tmp_path, login_node, slurm_cluster):
    """The laptop (its project: the repo's train.py, conf/ and recipes/, and a small app), the cluster's remote
    root, and the overrides of a launch over SSH."""
    if login_node.process is None:
        login_node.start()
    template = tmp_path / "template"
    template.mkdir()
    shutil.copy(REPO / "train.py", template / "train.py")
    shutil.copytree(REPO / "conf", template / "conf")
    shutil.copytree(REPO / "recipes", template / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    (template / "app.py").write_text(APP)
    (template / "conf" / "app.yaml").write_text("x: 0\ngate: null\nnum_nodes: 1\ndevices: 1\n")
    remote_root = tmp_path / "cluster"
    laptop = Laptop(tmp_path / "laptop", tmp_path / "laptop" / "home", hidden=[remote_root]).start()
    project = laptop.home / "project"
    laptop.run(["mkdir", "-p", str(project)]).check_returncode()
    laptop.copy_in(template, project)
    shutil.rmtree(template)  # from here on, the project is on the laptop only
    conf = cluster_env()["SLURM_CONF"]
    ssh = login_node.ssh_settings(remote_root, PYTHON, setup=[f"export SLURM_CONF={conf}"])
    yield Site(laptop, project, remote_root, ssh, login_node, tmp_path)
    laptop.close()


def _launcher(script: str) -> str:
    """train.py selects its cluster; the small app, like any Hydra app, its launcher."""
    return "cluster=slurm" if script == "train.py" else "hydra/launcher=mmt_slurm"


class Site:
    def __init__(self, laptop: Laptop, project: Path, remote_root: Path, ssh: List[str], node: LoginNode, tmp: Path):
        self.laptop, self.project, self.remote_root, self.ssh, self.node, self.tmp = (
            laptop,
            project,
            remote_root,
            ssh,
            node,
            tmp,
        )

    def launch(
        self, script: str, *overrides: str, sweep: str = "sweep", timeout: float = 300
    ) -> subprocess.CompletedProcess:
        return self.laptop.run(
            [
                PYTHON,
                script,
                "-m",
                _launcher(script),
                *FAST,
                *self.ssh,
                f"hydra.sweep.dir={self.sweep(sweep)}",
                *overrides,
            ],
            cwd=self.project,
            timeout=timeout,
        )

    def start(self, script: str, *overrides: str, sweep: str = "sweep") -> subprocess.Popen:
        return self.laptop.popen(
            [
                PYTHON,
                script,
                "-m",
                _launcher(script),
                *FAST,
                *self.ssh,
                f"hydra.sweep.dir={self.sweep(sweep)}",
                *overrides,
            ],
            out=self.tmp / "out.txt",
            cwd=self.project,
        )

    def start_at_gate(self, *overrides: str) -> Tuple[Path, subprocess.Popen]:
        """The small app launched attached with a gate; returned once its job waits there (the gate, the launcher)."""
        gate = self.tmp / "gate"
        launcher = self.start("app.py", "num_nodes=1", "devices=2", f"gate={gate}", *overrides)
        wait_until(Path(f"{gate}.started").exists, 180, "the job at its gate")
        return gate, launcher

    def sweep(self, name: str) -> Path:
        return self.project / "multirun" / name

    def mmt(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.laptop.run([str(Path(PYTHON).with_name("mmt")), *args], cwd=self.project, timeout=timeout)

    def result(self, sweep: str, num: int) -> Dict:
        text = self.laptop.read(self.sweep(sweep) / str(num) / "result.json")
        assert text is not None, f"no result.json for job {num} on the laptop"
        return json.loads(text)

    def there(self, sweep: str) -> Path:
        """The sweep's dir on the cluster."""
        return Path(f"{self.remote_root}/sweeps{self.sweep(sweep)}")

    def output(self) -> str:
        return (self.tmp / "out.txt").read_text()


def test_the_laptop_shares_nothing_with_the_cluster(site):
    """What the other tests rely on: from the laptop, no SLURM command runs and the remote root is empty; from the
    cluster, the laptop's project is not there."""
    assert site.laptop.run(["sh", "-c", "command -v sbatch && sbatch --version"]).returncode != 0
    (site.remote_root / "marker").parent.mkdir(parents=True, exist_ok=True)
    (site.remote_root / "marker").write_text("on the cluster")
    assert not site.laptop.exists(site.remote_root / "marker")
    assert site.laptop.exists(site.project / "train.py") and not (site.project / "train.py").exists()


def test_a_2x2_probe_runs_from_the_laptop_and_its_result_comes_back(site):
    done = site.launch("train.py", "recipe=probe", "num_nodes=2", "devices=2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[#0 n0 r0] probe: 4 ranks on 2 nodes answered" in done.stdout  # rank 0's log, streamed, prefixed
    result = site.result("sweep", 0)
    assert result["status"] == "COMPLETED" and result["world_size"] == 4 and result["num_nodes"] == 2
    assert result["return_value"]["all_reduce"] == 10.0  # real torch.distributed across the two SLURM nodes
    # the code ran from the copy synced to the cluster, not from the laptop's project (which the cluster lacks)
    assert result["snapshot"]["dir"].startswith(f"{site.remote_root}/code/")
    assert result["snapshot"]["source"] == str(site.project)
    # the logs stay on the cluster; the records came back
    there = site.there("sweep") / "0"
    assert (there / "logs" / "node0.rank0.log").is_file()
    assert not site.laptop.exists(site.sweep("sweep") / "0" / "logs")
    assert site.laptop.exists(site.sweep("sweep") / "0" / ".hydra" / "config.yaml")


def test_a_sweep_of_four_jobs_brings_back_every_value(site):
    done = site.launch("app.py", "x=0,1,2,3", "num_nodes=1", "devices=2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for x in range(4):
        result = site.result("sweep", x)
        assert result["status"] == "COMPLETED"
        assert result["return_value"]["x"] == x and result["return_value"]["loss"] == (x - 1.5) ** 2
        assert result["return_value"]["file"].startswith(f"{site.remote_root}/code/")
        assert result["return_value"]["conf_there"] and result["return_value"]["conf"].startswith(
            f"{site.remote_root}/code/"
        )
        assert site.laptop.exists(Path(site.sweep("sweep")) / str(x) / ".mmt" / "attempts")
    assert site.laptop.read(site.sweep("sweep") / "summary.csv").count("COMPLETED") == 4


def test_an_optuna_sweep_over_ssh_gets_each_trials_value(site):
    done = site.launch(
        "app.py",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.sampler.seed=1",
        "x=range(0,4)",
        "num_nodes=1",
        "devices=1",
        "+hydra.launcher.optimized_metric=loss",
        sweep="optuna",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    best = OmegaConf.to_container(
        OmegaConf.create(site.laptop.read(site.sweep("optuna") / "optimization_results.yaml"))
    )
    values = [site.result("optuna", n)["return_value"]["loss"] for n in range(4)]
    assert best["best_value"] == pytest.approx(min(values))  # each trial's value reached Optuna on the laptop


def test_detached_jobs_are_listed_logged_and_stopped_from_the_laptop(site):
    gate = site.tmp / "gate"
    done = site.launch(
        "app.py", "num_nodes=2", "devices=2", f"gate={gate}", "hydra.launcher.detach=true", "hydra.launcher.name=far"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wait_until(Path(f"{gate}.started").exists, 180, "the detached job at its gate")
    listed = site.mmt("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["far-0"]["status"] == "Running" and rows["far-0"]["host"] == "mmt-login"
    logs = site.mmt("logs", "far-0", "--rank", "1")
    assert logs.returncode == 0 and "rank 1 of 4 on 0 says hello" in logs.stdout, logs.stdout + logs.stderr
    stopped = site.mmt("stop", "far-0")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_until(
        lambda: json.loads(site.mmt("list", "--json").stdout)[0]["status"] not in ("Running", "Pending"), 120, "stopped"
    )
    final = {row["name"]: row for row in json.loads(site.mmt("list", "--json").stdout)}
    assert final["far-0"]["status"] == "Stopped", final["far-0"]
    assert queued() == ""


SDK = """
import json, sys
from pathlib import Path
import mmt
job = mmt.Job.get(sys.argv[1])
seen = {"status": job.status.value, "log": job.logs(rank=1)}
Path(sys.argv[2]).touch()  # the gate: the job may end now
seen["ended"] = job.wait(timeout=240).value
seen["result"], seen["here"] = job.result, (job.dir / "result.json").exists()
print(json.dumps(seen))
"""


def test_the_sdk_on_the_laptop_follows_a_job_on_the_cluster(site):
    gate = site.tmp / "gate"
    done = site.launch(
        "app.py",
        "x=3",
        "num_nodes=2",
        "devices=2",
        f"gate={gate}",
        "hydra.launcher.detach=true",
        "hydra.launcher.name=sdk",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wait_until(Path(f"{gate}.started").exists, 180, "the detached job at its gate")
    asked = site.laptop.run([PYTHON, "-c", SDK, "sdk-0", str(gate)], cwd=site.project, timeout=300)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    seen = json.loads(asked.stdout.strip().splitlines()[-1])
    assert seen["status"] == "Running" and "rank 1 of 4 on 0 says hello" in seen["log"]
    assert seen["ended"] == "Completed" and seen["here"] is True and seen["result"]["loss"] == 2.25


def test_a_cut_connection_is_restored_and_the_result_arrives(site):
    gate, launcher = site.start_at_gate()
    time.sleep(1.0)  # the launcher follows the console
    site.node.cut()
    wait_until(
        lambda: "lost the connection" in site.output() or launcher.poll() is not None, 60, "the launcher noticed"
    )
    assert launcher.poll() is None, site.output()[-3000:]
    gate.touch()  # the job completes on the cluster while the link is down
    wait_until(lambda: (site.there("sweep") / "0" / "result.json").exists(), 120, "the job's end on the cluster")
    site.node.start()
    assert launcher.wait(timeout=180) == 0, site.output()[-3000:]
    output = site.output()
    assert output.count("lost the connection") == 1 and "reconnected to mmt-login" in output
    assert site.result("sweep", 0)["status"] == "COMPLETED"


def test_ctrl_c_on_the_laptop_stops_the_jobs_on_the_cluster(site):
    _, launcher = site.start_at_gate()
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=120) == 130, site.output()[-3000:]
    assert "stopping the jobs on mmt-login" in site.output()
    result = site.result("sweep", 0)  # stopped there, its result written there and brought back
    assert result["status"] == "INTERRUPTED", result
    assert (site.there("sweep") / "0" / "result.json").exists()
    wait_until(lambda: queued() == "", 60, "the job gone from SLURM's queue")


def test_past_the_grace_the_launcher_gives_up_and_mmt_wait_reattaches(site):
    gate, launcher = site.start_at_gate("hydra.launcher.name=graceful", "+hydra.launcher.ssh.grace_s=3")
    time.sleep(1.0)
    site.node.cut()
    assert launcher.wait(timeout=120) != 0
    output = site.output()
    assert "the jobs may still be running there" in output and "mmt wait" in output and "graceful-0" in output
    gate.touch()
    site.node.start()
    waited = site.mmt("wait", "graceful-0", timeout=300)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert site.result("sweep", 0)["status"] == "COMPLETED"  # brought back by the re-attach


def _with(ssh: List[str], key: str, value: str) -> List[str]:
    """The launch's ssh overrides with ``key`` set to ``value`` (added when absent)."""
    name = f"+hydra.launcher.ssh.{key}"
    return [o for o in ssh if not o.startswith(f"{name}=")] + [f"{name}={value}"]


def _other_key(site: "Site") -> List[str]:
    """A config that names a key the login node does not accept."""
    other = site.tmp / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    config = site.tmp / "config_other_key"
    config.write_text(site.node.config.read_text().replace(f"IdentityFile {site.node.key}", f"IdentityFile {other}"))
    return _with(_with(site.ssh, "config_file", str(config)), "identity_file", str(other))


def _unknown_host_key(site: "Site") -> List[str]:
    config = site.tmp / "config_unknown_host_key"
    config.write_text(site.node.config.read_text().replace("known_hosts", "empty_known_hosts"))
    return _with(site.ssh, "config_file", str(config))


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda s: _with(s.ssh, "host", "no-such-host.invalid"),
            "Invalid hydra.launcher.ssh.host='no-such-host.invalid': no such host",
        ),
        (_unknown_host_key, "Invalid hydra.launcher.ssh.host='mmt-login': its host key is not in known_hosts"),
        (_other_key, "mmt-login refused the login"),
        (
            lambda s: _with(s.ssh, "python", "/usr/bin/python3"),
            "Invalid hydra.launcher.ssh.python='/usr/bin/python3': cannot run mmt",
        ),
        (
            lambda s: _with(s.ssh, "remote_root", "/proc/mmt"),
            "Invalid hydra.launcher.ssh.remote_root='/proc/mmt': cannot write there",
        ),
        (lambda s: _with(s.ssh, "setup", "['export SLURM_CONF=/nonexistent']"), "Invalid hydra.launcher.ssh.setup="),
        (
            lambda s: [*s.ssh, "hydra.launcher.dashboard=true"],
            "Invalid hydra.launcher.dashboard=True: a launch over SSH",
        ),
    ],
    ids=[
        "unknown-host",
        "unknown-host-key",
        "refused-key",
        "no-mmt-there",
        "root-not-writable",
        "slurm-silent",
        "page",
    ],
)
def test_bad_input_is_one_line_before_anything_starts(site, change, says):
    done = site.laptop.run(
        [PYTHON, "app.py", "-m", _launcher("app.py"), *FAST, *change(site), f"hydra.sweep.dir={site.sweep('bad')}"],
        cwd=site.project,
        timeout=120,
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    assert len(errors) == 1 and says in errors[0], done.stderr
    assert queued() == ""  # nothing was submitted
    assert not list(site.remote_root.glob("sweeps/**/result.json"))
    assert not site.laptop.exists(site.sweep("bad") / "0")
