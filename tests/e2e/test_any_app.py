"""Issue 10: mmt as its users meet it: someone else's Hydra + Lightning app, Hydra's Optuna sweeper, a shell
without the venv on PATH, an unwired trainer topology, and a host with SLURM installed.

The third-party app is examples/third_party_app/ (outside conf/ and recipes/): its own trainer/model/data groups,
mmt's machine catalogue and cluster configs taken from the installed package, the topology wired in YAML only
(configs/launch/mmt.yaml), and a ``@rank_zero_only`` function called before the Trainer. Its README.md is the
project README's section "Using mmt from your own Hydra app"; these tests run what that section says.
"""

import csv
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import pytest
from omegaconf import OmegaConf

from helpers.app import app_env, job_dirs, results
from helpers.paths import REPO
from helpers.processes import wait_gone

APP = REPO / "examples" / "third_party_app"
PY = sys.executable
RANK_ZERO_LINE = "CONFIG TREE PRINTED BY RANK ZERO"
SRUN_WARNING = "The `srun` command is available on your system but is not used"
NOT_EMPTY_WARNING = re.compile(r"Experiment logs directory .* exists and is not empty")
# a Python warning as Lightning's rank_zero_warn prints it: "<file>.py:<line>: <message>"
WARNING_LINE = re.compile(r"^\S+\.py:\d+: (.+)$")
# what the LM recipe needs for a short but real study: a few optimizer steps, one validation at the end
SHORT_LM = ("recipe.max_steps=4", "recipe.val_check_interval=4", "recipe.limit_val_batches=2")


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    sweep_dir: Path
    seconds: float
    leftovers: List[int]

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def job_logs(self) -> Dict[str, str]:
        """Every file a job wrote its ranks' (or its command's) output to, and the job's Hydra log."""
        found = {}
        for job in job_dirs(self.sweep_dir):
            for path in sorted([*(job / "logs").glob("*.log"), *job.glob("*.log")]):
                found[str(path.relative_to(self.sweep_dir))] = path.read_text()
        return found


def _run(
    script: Path, *overrides: str, sweep_dir: Path, env: Dict[str, str], timeout: float = 150, multirun: bool = False
) -> subprocess.CompletedProcess:
    """``python <script> [-m] <overrides>`` from the script's own dir, as its user would type it."""
    args = [PY, script.name, *(["-m"] if multirun else []), *overrides, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.run(args, cwd=script.parent, env=env, capture_output=True, text=True, timeout=timeout)


def _timed(
    script: Path,
    *overrides: str,
    sweep_dir: Path,
    env: Dict[str, str],
    tag: str,
    timeout: float = 150,
    multirun: bool = False,
) -> Run:
    started = time.monotonic()
    proc = _run(script, *overrides, sweep_dir=sweep_dir, env=env, timeout=timeout, multirun=multirun)
    seconds = time.monotonic() - started
    left = wait_gone(tag)
    for pid in left:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return Run(proc=proc, sweep_dir=sweep_dir, seconds=seconds, leftovers=left)


def _fake_srun(where: Path) -> Path:
    """A dir holding an ``srun`` that is never meant to run: Lightning only asks whether one is on PATH, so the
    test sees the warning's condition on any host (this one also has SLURM's own /usr/bin/srun)."""
    folder = where / "slurm-bin"
    folder.mkdir(parents=True, exist_ok=True)
    srun = folder / "srun"
    srun.write_text("#!/bin/sh\necho 'fake srun: not for use' >&2\nexit 1\n")
    srun.chmod(0o755)
    return folder


def _with_srun(where: Path, tag: str) -> Dict[str, str]:
    return app_env(tag, PATH=f"{_fake_srun(where)}{os.pathsep}{os.environ.get('PATH', os.defpath)}")


def _noise(text: str) -> List[str]:
    return [line for line in text.splitlines() if SRUN_WARNING in line or NOT_EMPTY_WARNING.search(line)]


# ------------------------------------------------------------------------------------ the third-party app, 2 x 2


@pytest.fixture(scope="module")
def app_2x2(tmp_path_factory) -> Run:
    """The third-party app on 2 nodes x 2 processes, on a host where ``srun`` is on PATH. Run once for the tests
    below; like the ``tag`` fixture, no process it started may be left behind."""
    root = tmp_path_factory.mktemp("app_2x2")
    tag = uuid.uuid4().hex
    # no -m: the app's configs/launch/mmt.yaml sets hydra.mode=MULTIRUN, so the user's usual command goes through mmt
    return _timed(
        APP / "train_app.py", "num_nodes=2", "devices=2", sweep_dir=root / "sweep", env=_with_srun(root, tag), tag=tag
    )


def test_third_party_app_trains_2x2_as_a_world_of_4_and_its_rank_zero_only_code_runs_once(app_2x2):
    assert app_2x2.proc.returncode == 0, app_2x2.output[-4000:]
    assert app_2x2.leftovers == []
    (result,) = results(app_2x2.sweep_dir)
    assert result["status"] == "COMPLETED", result["error"]
    assert (result["num_nodes"], result["devices"], result["world_size"]) == (2, 2, 4)
    value = result["return_value"]  # rank 0's dict, as the app returned it
    assert value["world_size"] == 4 and value["steps"] == 12 and isinstance(value["val_loss"], float)

    job = job_dirs(app_2x2.sweep_dir)[0]
    logs = {p.name: p.read_text() for p in sorted((job / "logs").glob("*.log"))}
    assert sorted(logs) == ["node0.rank0.log", "node0.rank1.log", "node1.rank2.log", "node1.rank3.log"]
    for name, text in logs.items():  # every rank's own Trainer saw the whole world
        rank = int(name.rsplit("rank", 1)[1].split(".")[0])
        assert f"trainer: global_rank={rank} world_size=4 num_nodes=2 devices=2 steps=12" in text, text[-2000:]
    # @rank_zero_only ran before any Trainer existed, in ranks forked from an agent that imported Lightning
    counts = {name: text.count(RANK_ZERO_LINE) for name, text in logs.items()}
    assert counts == {"node0.rank0.log": 1, "node0.rank1.log": 0, "node1.rank2.log": 0, "node1.rank3.log": 0}
    assert app_2x2.proc.stdout.count(RANK_ZERO_LINE) == 1  # the console follows rank 0 only
    assert (job / "config_tree.txt").read_text().count("num_nodes: 2") >= 2  # top level and trainer.num_nodes


def test_wrong_warnings_are_gone_from_a_lightning_job_and_the_users_own_stay(app_2x2, tmp_path, tag):
    # control: the same app without mmt (launch=plain: Hydra's launcher, one process), same PATH, same output dir
    # layout: Lightning prints both warnings, so their absence below is mmt's doing
    plain_dir = tmp_path / "plain"
    plain = subprocess.run(
        [
            PY,
            "train_app.py",
            "launch=plain",
            f"hydra.run.dir={plain_dir}",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
        ],
        cwd=APP,
        env=_with_srun(tmp_path, tag),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    plain_output = plain.stdout + plain.stderr
    assert SRUN_WARNING in plain_output and NOT_EMPTY_WARNING.search(plain_output), plain_output[-3000:]

    assert app_2x2.proc.returncode == 0, app_2x2.output[-3000:]
    assert _noise(app_2x2.output) == []
    for name, text in app_2x2.job_logs().items():
        assert _noise(text) == [], name
    # warnings mmt has no reason to silence (Lightning 2.6.6 prints a deprecation of its own here) still reach
    # rank 0's log: mmt filters those two messages, not warnings as such
    others = {
        m.group(1)
        for line in plain_output.splitlines()
        if (m := WARNING_LINE.match(line)) and SRUN_WARNING not in line and not NOT_EMPTY_WARNING.search(line)
    }
    rank0 = (job_dirs(app_2x2.sweep_dir)[0] / "logs" / "node0.rank0.log").read_text()
    assert all(message in rank0 for message in others), (others, rank0[-3000:])


def test_command_mode_jobs_are_not_told_about_srun_either(tmp_path, tag):
    # The README's own command-mode example runs the Lightning guide's trainer.py per node; any Trainer built in a
    # command sees srun on PATH. mmt started that process and knows it is not a SLURM step, as for a recipe rank.
    script = tmp_path / "tiny_trainer.py"
    script.write_text(
        "import lightning as L\n"
        "trainer = L.Trainer(accelerator='cpu', logger=False, enable_checkpointing=False)\n"
        "print('TRAINER BUILT', trainer.num_nodes, trainer.num_devices)\n"
    )
    run = _timed(
        REPO / "train.py",
        "recipe=probe",
        "num_nodes=1",
        "devices=1",
        f"command='python {script}'",
        sweep_dir=tmp_path / "sweep",
        env=_with_srun(tmp_path, tag),
        tag=tag,
        multirun=True,
    )
    assert run.proc.returncode == 0, run.output[-3000:]
    logs = run.job_logs()
    assert any("TRAINER BUILT 1 1" in text for text in logs.values()), logs
    assert [line for text in logs.values() for line in _noise(text)] == []


# ----------------------------------------------------------------- catalogue and clusters from the installed mmt


def test_app_selects_mmts_machine_catalogue_and_clusters_from_the_installed_package(tmp_path, tag):
    configs = APP / "configs"
    # the app ships neither mmt's catalogue nor its clusters; one machine of its own extends the catalogue
    assert sorted(p.name for p in (configs / "machine").iterdir()) == ["workstation.yaml"]
    assert not (configs / "cluster").exists() and not (configs / "hydra").exists()
    # a dry run needs no SLURM: no srun/sbatch on PATH, no SLURM_CONF
    env = app_env(tag, PATH=str(tmp_path / "nothing-here"))
    env.pop("SLURM_CONF", None)
    run = _timed(
        APP / "train_app.py",
        "machine=A100_X_8,workstation",
        "cluster=slurm",
        "num_nodes=2",
        "devices=8",
        "hydra.launcher.dry_run=true",
        sweep_dir=tmp_path / "sweep",
        env=env,
        tag=tag,
        timeout=90,
    )
    assert run.proc.returncode == 0, run.output[-3000:]
    out = run.proc.stdout
    assert "mmt dry run: 2 job(s) on cluster=slurm; nothing is started" in out
    job0, job1 = out.split("\njob 1 (")
    assert "machine=A100_X_8 cluster=slurm num_nodes=2 devices=8" in job0
    assert "a100_x_8: 8x A100 40 GiB, 96 vCPU" in job0 and "#SBATCH --gpus-per-node=8" in job0
    assert "#SBATCH --nodes=2" in job0 and "2 nodes x 8 devices = 16 ranks" in job0
    assert "$21.96/h per node x 2 nodes" in job0  # the catalogue's price
    assert "workstation: 8 vCPU, 32 GiB RAM" in job1 and "no price for machine 'workstation'" in job1
    assert "#SBATCH --gpus-per-node" not in job1
    assert results(run.sweep_dir) == [] and job_dirs(run.sweep_dir) == []  # nothing started


def test_any_hydra_app_runs_with_mmt_from_the_command_line_alone(tmp_path, tag):
    # no launch file: the app as it was (launch=plain), mmt selected and the topology given on the command line.
    # Hydra refuses to sweep hydra.launcher.*, so the per-job values are new top-level keys (+num_nodes=1,2),
    # which the launcher's num_nodes/devices fields select by default (${oc.select:num_nodes,1}).
    refused = _run(
        APP / "train_app.py",
        "launch=plain",
        "hydra/launcher=mmt_local",
        "hydra.launcher.num_nodes=1,2",
        sweep_dir=tmp_path / "refused",
        env=app_env(tag),
        timeout=60,
        multirun=True,
    )
    assert refused.returncode != 0
    assert "Sweeping over Hydra's configuration is not supported : 'hydra.launcher.num_nodes=1,2'" in refused.stderr
    run = _timed(
        APP / "train_app.py",
        "launch=plain",
        "hydra/launcher=mmt_local",
        "+num_nodes=1,2",
        "+devices=2",
        "trainer=ddp",
        "trainer.num_nodes=${num_nodes}",
        "trainer.devices=${devices}",
        "hydra.launcher.dry_run=true",
        sweep_dir=tmp_path / "sweep",
        env=app_env(tag),
        tag=tag,
        timeout=60,
        multirun=True,
    )
    assert run.proc.returncode == 0, run.output[-3000:]
    assert "mmt dry run: 2 job(s) on cluster=local" in run.proc.stdout
    assert "1 nodes x 2 devices = 2 ranks" in run.proc.stdout and "2 nodes x 2 devices = 4 ranks" in run.proc.stdout


def test_an_apps_own_machine_file_overrides_the_catalogue_entry_in_any_spelling(tmp_path, tag):
    # the app, copied elsewhere as its user would keep it, with its own h100_x_8 (a negotiated price): whichever way
    # the user spells the name (the catalogue accepts Lightning's H100_X_8), the app's file must win over mmt's
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("multirun", "outputs", "__pycache__"))
    (app / "configs" / "machine" / "h100_x_8.yaml").write_text(
        "name: h100_x_8\naccelerator: gpu\ngpu_type: H100\ngpus: 8\ncpus: 192\nmemory_gb: 2048\n"
        "gpu_memory_gb: 80\nprice_per_hour: 1.5\nprice_source: our reserved-capacity contract\n"
    )
    run = _timed(
        app / "train_app.py",
        "machine=h100_x_8,H100_X_8",
        "devices=8",
        "hydra.launcher.dry_run=true",
        sweep_dir=tmp_path / "sweep",
        env=app_env(tag),
        tag=tag,
        timeout=60,
    )
    assert run.proc.returncode == 0, run.output[-3000:]
    job0, job1 = run.proc.stdout.split("\njob 1 (")
    assert "machine=h100_x_8 devices=8" in job0 and "$1.50/h per node" in job0, job0
    assert "machine=H100_X_8 devices=8" in job1
    assert "$1.50/h per node" in job1, [line for line in job1.splitlines() if "cost" in line or "machine " in line]


# --------------------------------------------------------------------------------------------- Optuna on train.py


def test_optuna_studies_the_lm_recipe_over_lr_and_num_nodes(tmp_path, tag):
    run = _timed(
        REPO / "train.py",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.sampler.seed=1",
        "recipe.lr=interval(0.1,1.0)",
        "num_nodes=1,2",
        "devices=2",
        *SHORT_LM,
        sweep_dir=tmp_path / "sweep",
        env=_with_srun(tmp_path, tag),
        tag=tag,
        timeout=240,
        multirun=True,
    )
    assert run.proc.returncode == 0, run.output[-4000:]
    assert run.leftovers == []
    assert "float-castable" not in run.output and "Failed experiment" not in run.output
    found = results(run.sweep_dir)
    assert [r["status"] for r in found] == ["COMPLETED"] * 4
    for result in found:  # result.json keeps rank 0's whole dict; Optuna got its val_loss
        value = result["return_value"]
        assert {"val_loss", "samples_per_s", "steps", "world_size"} <= set(value), value
        assert value["steps"] == 4 and value["world_size"] == result["world_size"] == 2 * result["num_nodes"]
    best = OmegaConf.to_container(OmegaConf.load(run.sweep_dir / "optimization_results.yaml"))
    assert best["name"] == "optuna" and set(best["best_params"]) == {"recipe.lr", "num_nodes"}
    assert 0.1 <= best["best_params"]["recipe.lr"] <= 1.0 and best["best_params"]["num_nodes"] in (1, 2)
    assert best["best_value"] == pytest.approx(min(r["return_value"]["val_loss"] for r in found))
    # the console: no Lightning warnings that are wrong for mmt's ranks (the LM recipe logs into the job dir)
    assert _noise(run.output) == [] and all(_noise(text) == [] for text in run.job_logs().values())


@pytest.fixture(scope="module")
def study_with_an_invalid_trial(tmp_path_factory) -> Run:
    """A study of two trials over num_nodes=choice(1,3) with devices=2 and the LM recipe's global batch of 64 (not
    divisible by 6): the seeded random sampler proposes num_nodes=3 first, then 1, in one batch. Optimises a
    top-level ``optimized_metric`` other than the recipe's summary_metric.

    Not the grid sampler: hydra-optuna-sweeper 1.3.0 tells Optuna a failed trial outside its own guard, and when
    that trial is the grid's last, GridSampler's ``study.stop()`` raises "Study.stop is supposed to be invoked
    inside an objective function" and the sweep exits 1 (the grid's order is random)."""
    root = tmp_path_factory.mktemp("invalid_trial")
    tag = uuid.uuid4().hex
    return _timed(
        REPO / "train.py",
        "hydra/sweeper=optuna",
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.max_failure_rate=0.5",
        "num_nodes=choice(1,3)",
        "devices=2",
        "+optimized_metric=train_loss_last",
        *SHORT_LM,
        sweep_dir=root / "sweep",
        env=app_env(tag),
        tag=tag,
        timeout=180,
        multirun=True,
    )


def test_an_invalid_trial_is_recorded_as_failed_and_the_study_goes_on(study_with_an_invalid_trial, tmp_path, tag):
    run = study_with_an_invalid_trial
    assert run.proc.returncode == 0, run.output[-4000:]
    assert run.leftovers == []
    message = (
        "Invalid batch.global_size=64: must be divisible by the world size 6 (3 nodes x 2 devices) so "
        "that every rank takes the same share of each optimizer step."
    )
    started = re.findall(r"#\d+ \S+: num_nodes=(\d)", run.output)  # mmt's launch lines
    refused = re.findall(r"Error executing job with overrides: \['num_nodes=(\d)'", run.output)  # Hydra's
    proposed = started + refused
    assert sorted(proposed) == ["1", "3"], f"the seeded sampler proposed num_nodes={proposed}: pick another seed"
    failed = [line for line in run.output.splitlines() if "Failed experiment:" in line]
    assert len(failed) == 1 and message in failed[0], run.output[-4000:]  # Optuna told the trial FAIL
    (done,) = results(run.sweep_dir)  # the other job of the same batch ran; nothing started for the invalid one
    assert done["status"] == "COMPLETED" and done["num_nodes"] == 1
    assert len(job_dirs(run.sweep_dir)) == 1
    best = OmegaConf.to_container(OmegaConf.load(run.sweep_dir / "optimization_results.yaml"))
    assert best["best_params"] == {"num_nodes": 1}
    # the number Optuna got is the app's optimized_metric, not the summary metric; result.json has them all
    assert best["best_value"] == pytest.approx(done["return_value"]["train_loss_last"])
    assert best["best_value"] != pytest.approx(done["return_value"]["val_loss"])

    # the basic sweeper's grid is known up front: the same invalid point refuses the whole sweep, nothing starts
    basic_dir = tmp_path / "basic"
    basic = subprocess.run(
        [PY, "train.py", "-m", "num_nodes=1,3", "devices=2", f"hydra.sweep.dir={basic_dir}"],
        cwd=REPO,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert basic.returncode != 0 and message in basic.stderr, basic.stdout[-2000:] + basic.stderr[-2000:]
    assert "Traceback" not in basic.stderr
    assert job_dirs(basic_dir) == []


def test_the_sweep_summary_lists_the_trial_that_was_refused(study_with_an_invalid_trial):
    # README (Outputs): summary.csv is "one row per job". The refused trial was job 0 of the sweep; without a row a
    # reader of summary.csv (or of the console summary) sees one job and no trace of the failed one.
    run = study_with_an_invalid_trial
    assert run.proc.returncode == 0, run.output[-3000:]
    with open(run.sweep_dir / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    by_job = {row["job"]: row for row in rows}
    assert sorted(by_job) == ["0", "1"], rows
    assert "num_nodes=3" in by_job["0"]["overrides"] and by_job["0"]["status"] == "FAILED"
    assert "batch.global_size=64" in by_job["0"]["note"]


# ------------------------------------------------------------------------------- commands in mmt's environment


def test_commands_run_with_the_launchers_python_and_torchrun_on_a_path_that_lacks_them(tmp_path, tag):
    bare_path = "/usr/bin:/bin"
    venv_bin = os.path.dirname(os.path.abspath(PY))
    # the shell's PATH really lacks them: no torchrun, and no python with this environment's packages
    probe = subprocess.run(
        ["sh", "-c", "command -v torchrun || echo NO_TORCHRUN"], env={"PATH": bare_path}, capture_output=True, text=True
    )
    assert probe.stdout.strip() == "NO_TORCHRUN"
    env = app_env(tag, PATH=bare_path)
    env.pop("VIRTUAL_ENV", None)
    command = (
        'python -c "import sys, omegaconf; print(sys.executable)" && echo VENV=$VIRTUAL_ENV '
        "&& echo TORCHRUN_AT=$(command -v torchrun) && torchrun --help >/dev/null && echo TORCHRUN_OK"
    )
    run = _timed(
        REPO / "train.py",
        "recipe=probe",
        "num_nodes=2",
        "devices=1",
        "command_mode=per_rank,per_node",
        f"command='{command}'",
        sweep_dir=tmp_path / "sweep",
        env=env,
        tag=tag,
        timeout=120,
        multirun=True,
    )
    assert run.proc.returncode == 0, run.output[-4000:]
    assert run.leftovers == []
    assert [r["status"] for r in results(run.sweep_dir)] == ["COMPLETED", "COMPLETED"]
    logs = run.job_logs()
    process_logs = {name: text for name, text in logs.items() if "/logs/" in name}
    assert len(process_logs) == 4, sorted(logs)  # 2 ranks per_rank, 2 nodes per_node
    for name, text in process_logs.items():
        lines = text.splitlines()
        assert os.path.abspath(PY) in lines, (name, text)
        assert f"VENV={sys.prefix}" in lines, (name, text)
        assert f"TORCHRUN_AT={venv_bin}/torchrun" in lines and "TORCHRUN_OK" in lines, (name, text)


# ----------------------------------------------------------------------------------- topology mismatch, fast


def test_an_unwired_trainer_topology_fails_fast_naming_both_worlds_and_the_fix(tmp_path, tag):
    # the trainer's own num_nodes (1) instead of ${num_nodes}: every rank asks torch.distributed for a world of 2
    # while mmt started 4 (node 1's ranks as ranks 2 and 3 of "2"); without mmt's guard the job would wait in
    # rendezvous or train a smaller world, up to the 2-minute limit set here. It must fail in seconds instead.
    run = _timed(
        APP / "train_app.py",
        "num_nodes=2",
        "devices=2",
        "trainer.num_nodes=1",
        "hydra.launcher.timeout_min=2",
        sweep_dir=tmp_path / "sweep",
        env=app_env(tag),
        tag=tag,
        timeout=200,
    )
    assert run.leftovers == []
    (result,) = results(run.sweep_dir)
    assert result["status"] == "FAILED", result
    assert result["duration_s"] < 30 and run.seconds < 60, (result["duration_s"], run.seconds)
    exception = result["failure"]["exception"]
    assert exception.startswith("TopologyMismatchError: torch.distributed.init_process_group(world_size=2, rank=")
    assert "WORLD_SIZE=4 (2 nodes x 2 devices)" in exception
    assert "trainer.num_nodes=${num_nodes}" in exception and "trainer.devices=${devices}" in exception
    assert "TopologyMismatchError" in run.output and "WORLD_SIZE=4" in run.output


def test_the_basic_sweeper_gets_the_value_as_it_is_whatever_optimized_metric_says(tmp_path, tag):
    # an app that names a key for optimising sweepers (the template convention) but returns no such key: the basic
    # sweeper needs no number, so its job is COMPLETED with its value unchanged, not FAILED for a missing key
    done = subprocess.run(
        [PY, "train.py", "-m", "recipe=probe", "+optimized_metric=no_such_key", f"hydra.sweep.dir={tmp_path}"],
        cwd=REPO,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED" and isinstance(result["return_value"], dict)
    assert "returned no number" not in done.stdout + done.stderr
