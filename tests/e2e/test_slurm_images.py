"""image= with hydra.launcher.container_runtime=oci on the SLURM test cluster: SLURM's own ``srun --container``, its
oci.conf running real rootless runc (scripts/slurm_cluster.sh writes it), both shapes on 2 nodes x 2, and nothing left.

The image is mmt's test image built offline by scripts/build_test_image.py (torch, Lightning, hydra-core, no mmt,
/train.py, and /etc/mmt-test-image, a file only the image has), as an OCI bundle on the host's filesystem, which every
test node sees.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.app import job_dirs, results, run_app
from helpers.images import image_results
from helpers.paths import REPO
from helpers.processes import TAG_VAR, wait_until
from helpers.slurm import queued

pytestmark = pytest.mark.slurm
MMT = str(Path(sys.executable).with_name("mmt"))
OCI = "hydra.launcher.container_runtime=oci"
SHAPE_1 = ("cluster=slurm", OCI, "command='python3 /train.py'", "command_mode=per_rank", "num_nodes=2", "devices=2")
# a rank's interpreter says it ran in the image: sitecustomize, on the ranks' PYTHONPATH through a mount
IN_IMAGE_MARK = """
import os
if os.environ.get("RANK") is not None:
    with open(os.path.join(os.path.dirname(__file__), "rank" + os.environ["RANK"]), "w") as f:
        f.write(str(os.path.exists("/etc/mmt-test-image")))
"""


@pytest.fixture(scope="session")
def oci_bundle(slurm_cluster, tmp_path_factory) -> str:
    """mmt's test image as an OCI bundle dir (scripts/build_test_image.py --bundle, no container CLI). Skips where
    runc is not installed (the test cluster then has no oci.conf); with MMT_REQUIRE_CONTAINERS=1 (CI) it fails."""
    required = os.environ.get("MMT_REQUIRE_CONTAINERS") == "1"
    if shutil.which("runc") is None:
        why = "runc is not installed (apt-get install runc), so the SLURM test cluster has no oci.conf"
        if required:
            pytest.fail(f"containers required (MMT_REQUIRE_CONTAINERS=1) but {why}")
        pytest.skip(why)
    conf = Path(slurm_cluster["SLURM_CONF"]).with_name("oci.conf")
    if not conf.exists():  # a cluster started before runc was installed
        subprocess.run([str(REPO / "scripts" / "slurm_cluster.sh"), "start"], capture_output=True, timeout=600)
    bundle = tmp_path_factory.mktemp("oci") / "bundle"
    script = str(REPO / "scripts" / "build_test_image.py")
    built = subprocess.run(
        [sys.executable, script, "--bundle", str(bundle), "--no-import"], capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return str(bundle)


def runc_containers() -> list:
    """Every container the test cluster's runc still knows (oci.conf: its state under <base>/runc/<user>)."""
    root = Path(os.environ["SLURM_CONF"]).parent.parent / "runc"
    found = []
    for state in root.glob("*"):
        listed = subprocess.run(["runc", "--root", str(state), "list", "-q"], capture_output=True, text=True)
        found += listed.stdout.split()
    return found


def nothing_left() -> None:
    wait_until(lambda: not queued() and not runc_containers(), 30, "the job and its containers gone")


# ------------------------------------------------------------------------------------------------ the two shapes


def test_shape_1_the_images_own_script_runs_on_every_rank_in_a_container(oci_bundle, tmp_path, tag):
    done = run_app(f"image={oci_bundle}", *SHAPE_1, sweep_dir=tmp_path, tag=tag, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [job] = job_dirs(tmp_path)
    ranks = image_results(job)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["in_image"] for r in ranks), "every rank ran inside the image"
    assert [(r["node_rank"], r["local_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 4),
        (0, 1, 4),
        (1, 0, 4),
        (1, 1, 4),
    ]
    assert {r["sum"] for r in ranks} == {10.0}, "the all-reduce went across both nodes' containers"
    assert len({r["weights"] for r in ranks}) == 1, "one model: identical weights on every rank"
    nothing_left()


def test_shape_2_the_task_function_trains_recipe_lm_in_the_image_with_mmt_mounted(oci_bundle, tmp_path, tag):
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "sitecustomize.py").write_text(IN_IMAGE_MARK)
    done = run_app(
        "cluster=slurm",
        OCI,
        f"image={oci_bundle}",
        "recipe=lm",
        "num_nodes=2",
        "devices=2",
        "recipe.max_steps=20",
        f"hydra.launcher.container_mounts=[{marks}:{marks}]",
        f"+env.PYTHONPATH={marks}:{REPO}/launcher_plugin:{REPO}",  # a spawned rank imports mmt from the project
        "hydra.launcher.start_method=spawn",  # each rank its own interpreter, which marks it (sitecustomize)
        sweep_dir=tmp_path / "sweep",
        tag=tag,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [result] = results(tmp_path / "sweep")
    value = result["return_value"]
    assert value["world_size"] == 4
    assert value["train_loss_last"] < value["train_loss_first"], "the loss went down"
    assert len(value["weight_digests"]) == 4 and len(set(value["weight_digests"])) == 1
    assert {p.name: p.read_text() for p in marks.glob("rank*")} == {f"rank{r}": "True" for r in range(4)}
    nothing_left()


# ------------------------------------------------------------------------------------------------ nothing left


@pytest.mark.parametrize("shape", ["command", "task function"])
def test_a_failing_rank_fails_the_job_naming_it_and_leaves_nothing(oci_bundle, tmp_path, tag, shape):
    if shape == "command":
        failing = ("command='if [ \"$RANK\" = 2 ]; then exit 7; fi; sleep 60'", "command_mode=per_rank")
    else:
        failing = ("recipe=probe", "recipe.fail_rank=2")
    done = run_app(
        "cluster=slurm", OCI, f"image={oci_bundle}", *failing, "num_nodes=2", "devices=2",
        sweep_dir=tmp_path, tag=tag, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    [result] = results(tmp_path)
    assert result["status"] == "FAILED"
    assert result["failure"]["rank"] == 2, result["failure"]
    if shape == "command":
        assert "7" in json.dumps(result["failure"]), result["failure"]
    nothing_left()


def test_mmt_stop_of_a_detached_job_leaves_nothing(oci_bundle, tmp_path, tag):
    name = f"oci-stop-{tag[:8]}"
    env = dict(os.environ, **{TAG_VAR: tag})
    submitted = subprocess.run(
        [MMT, "run", "--name", name, "--cluster", "slurm", "--num-machines", "2", "--devices", "2",
         "--command-mode", "per_rank", "--image", oci_bundle, "--set", OCI, "--command", "sleep 120", "--detach"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    wait_until(lambda: len(runc_containers()) == 4, 90, "four rank containers running")
    stopped = subprocess.run([MMT, "stop", name], env=env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    nothing_left()
    waited = subprocess.run([MMT, "wait", name], env=env, capture_output=True, text=True, timeout=120)
    assert "CANCELLED" in waited.stdout + waited.stderr or waited.returncode != 0
    subprocess.run([MMT, "delete", name], env=env, capture_output=True, timeout=60)


# ------------------------------------------------------------------------------------------------ bad input


def _refused(tmp_path, *overrides: str, **env: str) -> str:
    done = run_app("cluster=slurm", OCI, *overrides, sweep_dir=tmp_path / "sweep", timeout=120, **env)
    assert done.returncode != 0
    assert not queued(), "nothing was submitted"
    lines = [line for line in done.stderr.splitlines() if line.startswith("Invalid ")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_bad_input_is_refused_in_one_line_before_anything_is_submitted(oci_bundle, tmp_path):
    assert "image=" in _refused(tmp_path, f"image={tmp_path}/missing", "recipe=probe")
    bare = tmp_path / "bare"
    (bare / "rootfs" / "bin").mkdir(parents=True)
    shutil.copy(Path(oci_bundle) / "config.json", bare / "config.json")
    said = _refused(tmp_path, f"image={bare}", "recipe=probe")
    assert said.startswith("Invalid image=") and "python3" in said
    said = _refused(
        tmp_path, f"image={oci_bundle}", "recipe=probe", f"hydra.launcher.container_mounts=[{tmp_path}/gone:/data]"
    )
    assert said.startswith("Invalid hydra.launcher.container_mounts=") and "does not exist" in said
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    shutil.copy(os.environ["SLURM_CONF"], elsewhere / "slurm.conf")  # the same cluster, without its oci.conf
    said = _refused(tmp_path, f"image={oci_bundle}", "recipe=probe", SLURM_CONF=str(elsewhere / "slurm.conf"))
    assert said.startswith("Invalid hydra.launcher.container_runtime='oci'") and "oci.conf" in said


def test_the_dry_run_prints_node_0s_container_command_with_secrets_masked(oci_bundle, tmp_path):
    done = run_app(
        "cluster=slurm", OCI, f"image={oci_bundle}", "recipe=probe", "num_nodes=2", "devices=2",
        "+env.HF_TOKEN=hf_secretvalue123", "hydra.launcher.dry_run=true", sweep_dir=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    srun = [line for line in done.stdout.splitlines() if line.strip().startswith("srun ")]
    assert srun and re.search(r"--container=\S+/oci'? python3 -u -m mmt\.backends\.slurm\.task ", srun[0]), srun
    assert "hf_secretvalue123" not in done.stdout
    assert not queued()
