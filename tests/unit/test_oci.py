"""container_runtime=oci on SLURM (srun --container): the batch script, the attempt's derived bundle, what is refused
before anything is submitted. Pure or on tmp dirs: no cluster, no runc (the real runs: tests/e2e/test_slurm_images.py).
"""

import json
import os
import sys
from pathlib import Path

from helpers.paths import GOLDEN
from helpers.sbatch import ATTEMPT, PROJECT, render, sbatch_plan, slurm_settings
from mmt.backends.slurm import oci
from mmt.backends.slurm.sbatch import TaskTarget, render_script


def _bundle(root: Path, python: bool = True) -> Path:
    bundle = root / "bundle"
    (bundle / "rootfs" / "usr" / "bin").mkdir(parents=True)
    (bundle / "rootfs" / "etc").mkdir()
    (bundle / "rootfs" / "lib").symlink_to("usr/lib")
    if python:
        (bundle / "rootfs" / "usr" / "bin" / "python3").write_text("")
    config = {
        "process": {"terminal": True, "args": ["sh"], "env": ["PATH=/usr/bin"], "cwd": "/"},
        "root": {"path": "rootfs"},
        "hostname": "runc",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "uts", "mount", "user")]},
    }
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def test_golden_task_function_enters_the_attempts_bundle():
    settings = slurm_settings(container_runtime="oci", container_mounts=["/datasets:/data"])
    script = render(sbatch_plan(image="/shared/images/pytorch"), settings)
    text = script.replace(sys.executable, "<python>")
    path = GOLDEN / "oci.sbatch"
    if not path.exists():
        path.write_text(text)
    assert text == path.read_text()
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert f"--container={ATTEMPT.dir}/oci python3 -u -m mmt.backends.slurm.task" in srun
    assert "unset SLURM_PROCID SLURM_LOCALID SLURM_NODEID" in script


def test_a_job_array_finds_its_bundle_in_its_own_attempt_dir():
    plan = sbatch_plan(image="/shared/images/pytorch")
    script = render_script(plan, slurm_settings(container_runtime="oci"), PROJECT, "a", TaskTarget(manifest=Path("/m")))
    assert '--container="$MMT_TASK_ATTEMPT"/oci python3 ' in script


def test_a_command_runs_its_node_agent_on_the_host_and_each_rank_in_a_container():
    plan = sbatch_plan(image="/shared/images/pytorch", command="python /train.py", command_mode="per_rank")
    script = render(plan, slurm_settings(container_runtime="oci"))
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--container" not in srun and f"{sys.executable} -u -m mmt.backends.slurm.task" in srun
    argv = oci.rank_exec(Path("/a/oci"), "node2", "42", "/etc/slurm/slurm.conf")
    assert argv[:2] == ["env", "SLURM_CONF=/etc/slurm/slurm.conf"]
    assert {"--jobid=42", "--overlap", "--nodelist=node2", "--container=/a/oci", "--ntasks=1"} <= set(argv)


def test_the_derived_bundle_binds_the_image_and_the_job_into_a_skeleton(tmp_path):
    bundle = _bundle(tmp_path)
    plan = sbatch_plan(image=str(bundle), job_dir=str(tmp_path / "job"))
    derived = oci.derive(plan, ["/datasets:/data:ro"], "/home/ada/project", tmp_path / "attempt")
    config = json.loads((derived / "config.json").read_text())
    assert config["root"]["path"] == "rootfs" and (derived / "rootfs").is_dir()
    assert not (derived / "rootfs").is_symlink() and os.readlink(derived / "rootfs" / "lib") == "usr/lib"
    binds = {m["destination"]: m for m in config["mounts"]}
    assert binds["/usr"]["source"] == str((bundle / "rootfs" / "usr").resolve())
    assert binds["/home/ada/project"]["source"] == "/home/ada/project" and str(tmp_path / "job") in binds
    assert binds["/data"]["options"] == ["rbind", "ro"] and binds["/tmp"]["type"] == "tmpfs"
    assert [m["destination"] for m in config["mounts"]].index("/usr") < list(binds).index("/proc")
    assert {n["type"] for n in config["linux"]["namespaces"]} == {"pid", "mount", "user"}
    assert "hostname" not in config and config["process"]["terminal"] is False
    assert config["process"]["cwd"] == "/home/ada/project"


def test_bad_bundles_mounts_and_a_cluster_without_oci_conf_are_named(tmp_path):
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text("")
    (conf.parent / "oci.conf").write_text("")

    def said(image: str, mounts=(), command=None) -> list:
        plan = sbatch_plan(image=image, command=command)
        return [str(p) for p in oci.image_problems(plan, list(mounts), str(conf))]

    bundle = _bundle(tmp_path)
    assert said(str(bundle)) == []
    assert said(str(tmp_path / "nope"))[0].startswith("Invalid image=")
    assert "no such directory" in said(str(tmp_path / "nope"))[0]
    assert "an absolute path" in said("pytorch:24.05")[0]
    (tmp_path / "empty").mkdir()
    assert "no config.json and no rootfs/" in said(str(tmp_path / "empty"))[0]
    bare = _bundle(tmp_path / "bare", python=False)
    [problem] = said(str(bare))
    assert "python3" in problem and problem.startswith("Invalid image=")
    assert said(str(bare), command="python /train.py") == []  # a command needs no python3 of mmt's
    [mount] = said(str(bundle), mounts=[f"{tmp_path}/missing:/data"])
    assert mount.startswith("Invalid hydra.launcher.container_mounts=") and "does not exist" in mount
    (conf.parent / "oci.conf").unlink()
    [missing] = said(str(bundle))
    assert missing.startswith("Invalid hydra.launcher.container_runtime='oci'") and "RunTimeRun" in missing


def test_a_containers_node_is_found_by_its_host_name(monkeypatch):
    monkeypatch.setattr(oci.socket, "gethostname", lambda: "node2.cluster")
    assert oci.node_in_container(["node1", "node2"]) == 1
    assert oci.node_in_container(["a", "b"]) is None
