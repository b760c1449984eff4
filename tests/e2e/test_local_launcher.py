"""The local backend end to end, with real processes and real torch.distributed (gloo)."""

import re

from helpers.app import job_dirs, results, run_app


def test_probe_two_nodes_by_two_devices_forms_one_world(tmp_path, tag):
    done = run_app("recipe=probe", "num_nodes=2", "devices=2", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stderr
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED" and result["world_size"] == 4
    value = result["return_value"]
    assert value["all_reduce"] == 10.0  # 1+2+3+4: every rank is in one group
    ranks = value["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["node_rank"] for r in ranks] == [0, 0, 1, 1]
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
    assert len({r["master"] for r in ranks}) == 1 and len({r["pid"] for r in ranks}) == 4
    assert all(r["world_size"] == 4 for r in ranks)


def test_each_job_gets_its_own_values_and_concurrent_jobs_distinct_ports(tmp_path, tag):
    done = run_app(
        "recipe=probe",
        "num_nodes=1,2",
        "devices=2",
        "recipe.hold_s=2",
        "hydra.launcher.max_parallel_ranks=8",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode == 0, done.stderr
    first, second = results(tmp_path)
    assert (first["world_size"], second["world_size"]) == (2, 4)  # per-job num_nodes, not the master's
    assert (first["return_value"]["num_nodes"], second["return_value"]["num_nodes"]) == (1, 2)
    times = [[r["time"] for r in job["return_value"]["ranks"]] for job in (first, second)]
    # both jobs were in their collectives within the other's 2 s hold: they ran at the same time
    assert abs(min(times[0]) - min(times[1])) < 2.0
    ports = [job["return_value"]["ranks"][0]["master"] for job in (first, second)]
    assert ports[0] != ports[1]


def test_job_folder_console_and_summary(tmp_path, tag):
    done = run_app("recipe=probe", "num_nodes=2", "devices=2", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stderr
    [job] = job_dirs(tmp_path)
    logs = sorted(p.name for p in (job / "logs").iterdir())
    assert logs == ["node0.rank0.log", "node0.rank1.log", "node1.rank2.log", "node1.rank3.log"]
    assert sorted(p.name for p in (job / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert (job / "train.log").exists() and (job / "result.json").exists()
    assert not (job / ".mmt").exists(), "the payload is removed once the outcome is read"
    assert (tmp_path / "multirun.yaml").exists() and (tmp_path / "summary.csv").exists()
    # rank 0's output live, prefixed with job, node and rank; then the summary table
    assert "[#0 n0 r0] probe: 4 ranks on 2 nodes answered; all_reduce=10" in done.stdout
    assert re.search(
        r"^0\s+recipe=probe num_nodes=2 devices=2\s+COMPLETED\s+2 x 2\s+\d+\.\d s\s+[\d.]+$", done.stdout, re.M
    ), done.stdout


def test_without_multirun_flag_the_job_still_goes_through_the_launcher(tmp_path, tag):
    done = run_app("recipe=probe", "num_nodes=2", "devices=2", sweep_dir=tmp_path, tag=tag, multirun=False)
    assert done.returncode == 0, done.stderr
    [result] = results(tmp_path)
    assert result["return_value"]["all_reduce"] == 10.0 and result["world_size"] == 4


def test_spawn_start_method_gives_the_same_world(tmp_path, tag):
    done = run_app(
        "recipe=probe", "num_nodes=2", "devices=2", "hydra.launcher.start_method=spawn", sweep_dir=tmp_path, tag=tag
    )
    assert done.returncode == 0, done.stderr
    [result] = results(tmp_path)
    assert result["return_value"]["all_reduce"] == 10.0


def test_env_reaches_every_rank_and_inherited_cluster_variables_do_not(tmp_path, tag):
    done = run_app(
        "recipe=probe",
        "num_nodes=2",
        "devices=1",
        "+env.MY_FLAG=on",
        "recipe=probe",
        "command=null",
        sweep_dir=tmp_path,
        tag=tag,
        SLURM_NTASKS="8",
        SLURM_PROCID="5",
        TORCHELASTIC_RUN_ID="stray",
    )
    # SLURM_NTASKS would make Lightning/torch pick the wrong world; the probe would see rank 5 of 8
    assert done.returncode == 0, done.stderr
    [result] = results(tmp_path)
    assert [r["rank"] for r in result["return_value"]["ranks"]] == [0, 1]


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path, tag):
    done = run_app(
        "num_nodes=8",
        "machine=h100_x_8",
        "hydra.launcher.dry_run=true",
        "hydra.launcher.timeout_min=90",
        "+env.NCCL_DEBUG=INFO",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "nothing is started" in out
    assert "topology   8 nodes x 8 devices = 64 ranks" in out
    assert "machine    h100_x_8: 8x H100 80 GiB, 192 vCPU, 2048 GiB RAM, (p5.48xlarge)" in out
    # 8 nodes x $55.04/h x 1.5 h
    assert "$55.04/h per node x 8 nodes x 1.5 h time limit = $660.48" in out
    assert "env (user) NCCL_DEBUG=***   (values are never shown)" in out and "INFO" not in out
    # the first 16 ranks and the last 2, with the count of those between
    for rank in (*range(16), 62, 63):
        node, local = divmod(rank, 8)
        assert re.search(
            rf"^  rank {rank} +GLOBAL_RANK={rank} GROUP_RANK={node} LOCAL_RANK={local} "
            rf"MMT_NODE_ADDR=<node{node}> NODE_RANK={node} RANK={rank}$",
            out,
            re.M,
        ), rank
    assert "  ...        46 more ranks" in out and "rank 16 " not in out
    assert "WARNING    Invalid machine='h100_x_8'" in out  # this host has no GPUs: said, not started
    assert job_dirs(tmp_path) == []
