"""Issue 17, round 3, with real processes: a rerun into the same dir shows only its own output (item 7), a strategy
that spawns its own processes is refused before anything starts (item 16), docs/own-app.md followed word for word on
an app shaped like lightning-hydra-template trains on CPU and writes where the template does (item 19, and the
summary's metric label of item 15), and a detached supervisor's log does not copy rank output."""

import csv
import re
import resource
import subprocess
import sys
from typing import Dict

from hydra import compose, initialize_config_dir

from helpers.app import app_env, job_dirs, results, run_app
from helpers.paths import REPO
from helpers.processes import wait_until

PY = sys.executable
PROBE = ("recipe=probe", "num_nodes=1", "devices=2", "recipe.fail_rank=1")
THIRD_PARTY = REPO / "examples" / "third_party_app"
GUIDE = REPO / "docs" / "own-app.md"


# ------------------------------------------------------------------------------ 7. a rerun into the same dir


def test_a_rerun_into_the_same_sweep_dir_shows_only_its_own_output_and_failure(tmp_path, tag):
    first = run_app(*PROBE, "recipe.fail_mode=raise", sweep_dir=tmp_path, tag=tag, timeout=180)
    assert first.returncode != 0 and "ProbeFault" in first.stdout, first.stdout[-3000:]
    earlier = results(tmp_path)[0]["attempt"]

    # the same fixed hydra.sweep.dir (or a resume from last.ckpt): rank 1 now exits 3, with no traceback at all
    second = run_app(*PROBE, "recipe.fail_mode=exit", "recipe.exit_code=3", sweep_dir=tmp_path, tag=tag, timeout=180)
    assert second.returncode != 0
    out = second.stdout
    assert "ProbeFault" not in out and "Traceback" not in out, out[-4000:]
    tail = out[out.index("--- last lines of") :]
    assert "probe: rank 1 injects fault 'exit'" in tail
    assert out.count("injects fault") == 1, out  # this run's one line, not the earlier run's too
    result = results(tmp_path)[0]
    assert result["failure"]["rank"] == 1 and result["failure"]["exit_code"] == 3

    # the job dir: logs/ holds this attempt's output; the earlier run's is whole under logs/previous/<attempt>/
    logs = job_dirs(tmp_path)[0] / "logs"
    assert "ProbeFault" not in (logs / "node0.rank1.log").read_text()
    assert "ProbeFault" in (logs / "previous" / earlier / "node0.rank1.log").read_text()
    assert f"the earlier run's logs are in {logs / 'previous' / earlier}" in out
    # the console followed rank 0 from this attempt's start: every line it showed is in this attempt's log once
    shown = [line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[#0 n0 r0] ")]
    assert shown == (logs / "node0.rank0.log").read_text().splitlines()


# ---------------------------------------------------------------- 16. strategies that start their own processes


def test_a_spawning_strategy_is_refused_when_the_job_is_planned(tmp_path, tag):
    # CPU time, which a loaded host does not stretch as it stretches the wall clock (CI's took 39.6 s of wall clock
    # to compose and refuse): a job that started would add its ranks' imports and training
    started = _children_cpu_s()
    done = subprocess.run(
        [PY, "train_app.py", "num_nodes=1", "devices=2", "trainer.strategy=ddp_spawn", f"hydra.sweep.dir={tmp_path}"],
        cwd=THIRD_PARTY,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=200,
    )
    seconds = _children_cpu_s() - started
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "Invalid trainer.strategy='ddp_spawn'" in line]
    assert len(lines) == 1, done.stdout[-2000:] + done.stderr[-3000:]
    assert "HINT: trainer.strategy=ddp (mmt starts the processes" in lines[0]
    assert seconds < 20 and job_dirs(tmp_path) == [] and results(tmp_path) == []  # nothing started


def _children_cpu_s() -> float:
    """The CPU seconds this process's ended children used (a subprocess.run's, once it returned)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


# ----------------------------------------------------- 19. docs/own-app.md on a lightning-hydra-template app

# the template's files, as it ships them (configs/trainer/ddp.yaml, configs/paths/default.yaml, the sweep dir of
# configs/hydra/default.yaml; its colorlog overrides left out: hydra-colorlog is not installed here), around a small
# model with BatchNorm (the template's SimpleDenseNet has BatchNorm1d layers) and a task that returns the number
# under optimized_metric, as the template's train.py does
TEMPLATE: Dict[str, str] = {
    "train.py": """import os
from pathlib import Path

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))  # what rootutils.setup_root does

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
def main(cfg: DictConfig):
    model = hydra.utils.instantiate(cfg.model)
    data = hydra.utils.instantiate(cfg.data)
    trainer = hydra.utils.instantiate(cfg.trainer)
    trainer.fit(model, datamodule=data)
    print(f"trained: world_size={trainer.world_size} norm={type(model.net[1]).__name__}", flush=True)
    metric_dict = {key: float(value) for key, value in trainer.callback_metrics.items()}
    return metric_dict.get(cfg.get("optimized_metric"))  # the template's get_metric_value


if __name__ == "__main__":
    main()
""",
    "bn_model.py": """import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DenseNet(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(256, 8, generator=generator)
        y = x.sum(dim=1, keepdim=True)
        self.train_set, self.val_set = TensorDataset(x[:192], y[:192]), TensorDataset(x[192:], y[192:])
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)
""",
    "configs/__init__.py": "",
    "configs/train.yaml": """# @package _global_
defaults:
  - _self_
  - data: synthetic
  - model: dense
  - logger: null
  - trainer: default
  - paths: default
  - hydra: default
  - experiment: null
  - debug: null
  - launch: mmt

task_name: "train"
optimized_metric: "val/loss"
""",
    "configs/data/synthetic.yaml": "_target_: bn_model.Data\nbatch_size: 16\n",
    "configs/model/dense.yaml": "_target_: bn_model.DenseNet\nlr: 0.05\n",
    "configs/logger/csv.yaml": (
        "csv:\n  _target_: lightning.pytorch.loggers.csv_logs.CSVLogger\n  save_dir: ${paths.output_dir}\n"
    ),
    "configs/experiment/example.yaml": "# @package _global_\nseed: 12345\n",
    "configs/debug/default.yaml": "# @package _global_\ntrainer:\n  max_epochs: 1\n",
    "configs/trainer/default.yaml": """_target_: lightning.pytorch.trainer.Trainer

default_root_dir: ${paths.output_dir}

min_epochs: 1 # prevents early stopping
max_epochs: 1

accelerator: cpu
devices: 1

# perform a validation loop every N training epochs
check_val_every_n_epoch: 1

# set True to to ensure deterministic results
# makes training slower but gives more reproducibility than just setting seeds
deterministic: False

# a short run for the test
limit_train_batches: 4
limit_val_batches: 2
num_sanity_val_steps: 0
enable_progress_bar: False
enable_model_summary: False
enable_checkpointing: False
logger: False
""",
    "configs/trainer/ddp.yaml": """defaults:
  - default

strategy: ddp

accelerator: gpu
devices: 2
num_nodes: 1
sync_batchnorm: True
""",
    "configs/paths/default.yaml": """# path to root directory
# this requires PROJECT_ROOT environment variable to exist
# you can replace it with "." if you want the root to be the current working directory
root_dir: ${oc.env:PROJECT_ROOT}

# path to data directory
data_dir: ${paths.root_dir}/data/

# path to logging directory
log_dir: ${paths.root_dir}/logs/

# path to output directory, created dynamically by hydra
# path generation pattern is specified in `configs/hydra/default.yaml`
# use it to store all files generated during the run, like ckpts and metrics
output_dir: ${hydra:runtime.output_dir}

# path to working directory
work_dir: ${hydra:runtime.cwd}
""",
    "configs/hydra/default.yaml": """# output directory, generated dynamically on each run
run:
  dir: ${paths.log_dir}/${task_name}/runs/${now:%Y-%m-%d}_${now:%H-%M-%S}
sweep:
  dir: ${paths.log_dir}/${task_name}/multiruns/${now:%Y-%m-%d}_${now:%H-%M-%S}
  subdir: ${hydra.job.num}

job_logging:
  handlers:
    file:
      # Incorporates fix from https://github.com/facebookresearch/hydra/pull/2242
      filename: ${hydra.runtime.output_dir}/${task_name}.log
""",
}


def _guides_launch_file() -> str:
    """configs/launch/mmt.yaml exactly as docs/own-app.md gives it."""
    text = GUIDE.read_text()
    match = re.search(r"```yaml\n((?:# [^\n]*\n)*# configs/launch/mmt\.yaml.*?)```", text, re.S)
    assert match, "docs/own-app.md no longer shows configs/launch/mmt.yaml"
    return match.group(1)


def test_the_own_app_guide_word_for_word_runs_a_lightning_hydra_template_app_on_cpu(tmp_path, tag):
    app = tmp_path / "template"
    for name, text in TEMPLATE.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text)
    (app / "configs" / "launch").mkdir()
    (app / "configs" / "launch" / "mmt.yaml").write_text(_guides_launch_file())
    # the guide: `- launch: mmt` as the last line of the template's defaults list (written above)
    defaults = (app / "configs" / "train.yaml").read_text().split("\n\n")[0].splitlines()
    assert defaults[-1] == "  - launch: mmt" and defaults[-2] == "  - debug: null"

    # the guide's command, on this CPU host (machine=cpu is the launch file's default)
    done = subprocess.run(
        [PY, "train.py", "num_nodes=1", "devices=2"],
        cwd=app,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "SyncBatchNorm" not in done.stdout + done.stderr
    # where the template writes: logs/train/multiruns/<date>_<time>/<job>, not ./multirun/
    assert not (app / "multirun").exists()
    [sweep] = list((app / "logs" / "train" / "multiruns").iterdir())
    [result] = results(sweep)
    assert result["status"] == "COMPLETED" and result["world_size"] == 2, result
    assert isinstance(result["return_value"], float)
    rank0 = (sweep / "0" / "logs" / "node0.rank0.log").read_text()
    assert "trained: world_size=2 norm=BatchNorm1d" in rank0  # plain BatchNorm on CPU: no SyncBatchNorm
    # item 15: the job returned the number under optimized_metric, and that is its label (not val_loss)
    header = next(line for line in done.stdout.splitlines() if line.startswith("#  overrides"))
    assert header.split()[-1] == "val/loss", done.stdout[-2000:]
    with open(sweep / "summary.csv", newline="") as handle:
        assert next(csv.reader(handle))[7] == "val/loss"
    assert result["summary_metric"] == "val/loss"


def test_the_guides_launch_file_turns_sync_batchnorm_on_for_gpu_machines(tmp_path):
    # the GPU half of the guide, without a GPU: what the Trainer gets, from the config a job composes
    app = tmp_path / "template"
    for name, text in TEMPLATE.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text)
    (app / "configs" / "launch").mkdir()
    (app / "configs" / "launch" / "mmt.yaml").write_text(_guides_launch_file())
    trainers = {}
    with initialize_config_dir(config_dir=str(app / "configs"), job_name="train", version_base="1.3"):
        for machine in ("cpu", "A100_X_8", "cpu_x_4", "h100_x_8"):
            config = compose("train", overrides=[f"machine={machine}", "devices=2"])
            trainers[machine] = {
                key: config.trainer[key]
                for key in ("strategy", "accelerator", "devices", "num_nodes", "sync_batchnorm")
            }
    for machine in ("cpu", "cpu_x_4"):
        assert trainers[machine] == {
            "strategy": "ddp",
            "accelerator": "cpu",
            "devices": 2,
            "num_nodes": 1,
            "sync_batchnorm": False,
        }, machine
    for machine in ("A100_X_8", "h100_x_8"):  # the template's own sync_batchnorm: True, on GPUs
        assert trainers[machine] == {
            "strategy": "ddp",
            "accelerator": "gpu",
            "devices": 2,
            "num_nodes": 1,
            "sync_batchnorm": True,
        }, machine


# ------------------------------------------------------------------------- the detached supervisor's own log


def test_a_detached_supervisors_log_does_not_store_rank_output_again(tmp_path, tag):
    done = run_app(
        "recipe=probe",
        "num_nodes=1",
        "devices=1",
        "hydra.launcher.detach=true",
        f"hydra.launcher.name=quiet-{tag[:6]}",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [log] = wait_until(lambda: list(tmp_path.glob("supervisor-*.log")), 30, "the supervisor's log")
    wait_until(lambda: "mmt summary" in log.read_text(), 120, "the supervisor's summary")
    rank0 = (tmp_path / "0" / "logs" / "node0.rank0.log").read_text()
    assert "probe: 1 ranks on 1 nodes answered" in rank0
    supervised = log.read_text()
    assert "probe: 1 ranks on 1 nodes answered" not in supervised and "[#0 n0" not in supervised, supervised
    assert "#0 quiet-" in supervised and results(tmp_path)[0]["status"] == "COMPLETED"
