"""The batch plan: a recipe's global batch split into world x micro-batch x accumulation, limited per device by
the tuned table, refused with a hint when it cannot divide, and handed to every rank. (The dry run that shows it,
and the refusal on the console: tests/e2e/test_batch_plan.py.)"""

import pytest
import yaml

from mmt.core.errors import ConfigError
from mmt.core.rank_env import RankInfo, RankPlace, contract_env
from mmt.planning.batch import plan_batch
from mmt.planning.machine import Machine
from mmt.planning.tuned import write_entry

CPU = Machine(name="cpu", accelerator="cpu", gpus=0, cpus=4, memory_gb=16)
A100_X_8 = Machine(name="a100_x_8", accelerator="gpu", gpus=8, cpus=96, memory_gb=1152, gpu_memory_gb=40)


def _plan(global_size, num_nodes, devices, machine=CPU, **spec):
    spec = {"global_size": global_size, "recipe": "lm", "precision": "32-true", "default_micro": 16, **spec}
    return plan_batch(spec, machine=machine, num_nodes=num_nodes, devices=devices)


@pytest.mark.parametrize("global_size", [96, 240, 256, 768])
@pytest.mark.parametrize("limit", [1, 7, 16, 64])
def test_plan_arithmetic_from_1x1_to_4x8(global_size, limit):
    for num_nodes in (1, 2, 3, 4):
        for devices in (1, 2, 4, 8):
            world = num_nodes * devices
            if global_size % world:
                with pytest.raises(ConfigError):
                    _plan(global_size, num_nodes, devices, default_micro=limit)
                continue
            plan = _plan(global_size, num_nodes, devices, default_micro=limit)
            assert plan.world_size == world and plan.limit == limit
            assert world * plan.micro * plan.accumulate == global_size
            # the largest micro-batch within the limit that splits the rank's share evenly
            share = global_size // world
            assert plan.micro == max(m for m in range(1, min(share, limit) + 1) if share % m == 0)


def test_worked_examples():
    assert (_plan(256, 1, 1).micro, _plan(256, 1, 1).accumulate) == (16, 16)
    assert (_plan(256, 4, 8).micro, _plan(256, 4, 8).accumulate) == (8, 1)  # share 8 < limit 16
    assert (_plan(240, 2, 4, default_micro=16).micro, _plan(240, 2, 4, default_micro=16).accumulate) == (15, 2)
    assert (_plan(96, 3, 2, default_micro=7).micro, _plan(96, 3, 2, default_micro=7).accumulate) == (4, 4)
    assert _plan(None, 2, 2) is None and plan_batch(None, machine=CPU, num_nodes=1, devices=1) is None


def test_indivisible_global_batch_names_the_node_counts_that_work():
    with pytest.raises(ConfigError) as caught:
        _plan(96, 5, 2)
    assert str(caught.value) == (
        "Invalid batch.global_size=96: must be divisible by the world size 10 (5 nodes x 2 devices) so that every "
        "rank takes the same share of each optimizer step. HINT: with devices=2, num_nodes=1,2,3,4,6,8,12,16,24,48 "
        "divide it; or keep num_nodes=5 and set batch.global_size=90 or 100"
    )


def test_forced_micro_batch_must_divide_and_fit():
    plan = _plan(64, 2, 2, micro=8)
    assert (plan.micro, plan.accumulate) == (8, 2) and "batch.micro forced 8" in plan.limit_source
    with pytest.raises(
        ConfigError,
        match=r"Invalid batch.micro=32: must divide .* = 16 and be <= the limit 16 .*"
        r"HINT: use one of 1, 2, 4, 8, 16",
    ):
        _plan(64, 2, 2, micro=32)
    with pytest.raises(ConfigError, match=r"Invalid batch.micro=3: must divide"):
        _plan(64, 2, 2, micro=3)


def test_bad_batch_sections_are_refused():
    with pytest.raises(ConfigError, match=r"Invalid batch.global_size=0: expected a whole number >= 1"):
        _plan(0, 1, 1)
    with pytest.raises(ConfigError, match=r"Invalid batch.globl_size=64: not a batch key"):
        plan_batch({"globl_size": 64}, machine=CPU, num_nodes=1, devices=1)
    with pytest.raises(
        ConfigError,
        match=r"Invalid batch.table='pkg://no_such_package_x/t.yaml': package "
        r"'no_such_package_x'.*cannot be found",
    ):
        _plan(64, 1, 1, table="pkg://no_such_package_x/t.yaml")


def _entry(machine, memory, micro, precision="32-true"):
    return {
        "recipe": "lm",
        "machine": machine,
        "precision": precision,
        "memory_per_device_gb": memory,
        "micro_batch": micro,
        "tuned_at": "2026-01-02",
        "versions": {"torch": "2.13.0", "lightning": "2.6.6"},
        "samples_per_s": 123.0,
    }


def test_the_limit_comes_from_the_tuned_entry_for_the_jobs_memory_per_device(tmp_path):
    table = tmp_path / "lm.yaml"
    write_entry(table, _entry("cpu", 16.0, 32))
    write_entry(table, _entry("cpu", 8.0, 12))
    write_entry(table, _entry("a100_x_8", 40.0, 64, precision="bf16-mixed"))
    write_entry(table, _entry("cpu", 8.0, 8))  # same key: replaces the 12
    entries = yaml.safe_load(table.read_text())["entries"]
    assert [(e["machine"], e["memory_per_device_gb"], e["micro_batch"]) for e in entries] == [
        ("a100_x_8", 40.0, 64),
        ("cpu", 8.0, 8),
        ("cpu", 16.0, 32),
    ]
    where = str(table)
    one = _plan(256, 1, 1, table=where)  # 16 GiB per device
    assert (one.limit, one.micro, one.accumulate) == (32, 32, 8)
    assert one.limit_source.startswith(
        "tuned for lm/cpu/32-true with 16 GiB per device, tuned 2026-01-02, torch "
        "2.13.0, lightning 2.6.6, 123 samples/s"
    )
    assert _plan(256, 1, 2, table=where).limit == 8  # 8 GiB per device: the 16 GiB entry would overcommit
    four = _plan(256, 1, 4, table=where)  # 4 GiB per device: nothing tuned that small
    assert four.limit == 16 and "tuned with more than this job's 4 GiB per device" in four.limit_source
    gpu = _plan(256, 2, 8, machine=A100_X_8, precision="bf16", table=where)  # bf16 = bf16-mixed
    assert (gpu.limit, gpu.micro, gpu.accumulate) == (64, 16, 1)
    assert "no tuned entry for lm/a100_x_8/32-true" in _plan(256, 2, 8, machine=A100_X_8, table=where).limit_source


def test_every_rank_reads_the_plan_back():
    plan = _plan(64, 2, 2, micro=8)
    env = contract_env(
        RankPlace(1, 1, 2, 2),
        per_node=False,
        master_addr="127.0.0.1",
        master_port=1,
        job_dir="/j",
        job_id="x",
        extra=plan.env(),
    )
    info = RankInfo.from_env(env)
    assert (info.global_batch_size, info.micro_batch_size, info.grad_accum) == (64, 8, 2)
    assert info.batch_sizes() == (8, 2) and info.batch_sizes(8) == (8, 2)
    with pytest.raises(ValueError, match=r"micro-batch 16 x accumulation 2 but the launcher planned 8 x 2"):
        info.batch_sizes(16)
    assert RankInfo.from_env({}).batch_sizes(default_micro=4) == (4, 1)  # outside a job
