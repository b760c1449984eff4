"""The local backend's container command lines and refusals that need no runtime, and how a rank in another Python
(an image's) reads its payload. The runs themselves: tests/e2e/test_images.py."""

import pickle
import sys

import pytest

from helpers.plans import local_plan
from mmt.backends.local import images
from mmt.core.errors import ConfigError
from mmt.records import payload


def test_a_node_container_runs_on_the_host_network_labelled_with_its_job_and_mounts_the_job_and_project():
    plan = local_plan(image="img:1", command=None, job_dir="/tmp/job")
    settings = images.ContainerSettings(runtime="podman", mounts=("/data:/data:ro",))
    run = images.node_container(plan, settings, "mmt-x-n0", 0, "/work/project").run_argv
    assert run[:3] == ("podman", "run", "-d") and "--network=host" in run and "--pull=never" in run
    assert "mmt.job=local-1-0" in run and "mmt.job_dir=/tmp/job" in run
    binds = [run[i + 1] for i, arg in enumerate(run) if arg == "-v"]
    assert "/tmp/job:/tmp/job" in binds and "/work/project:/work/project" in binds and "/data:/data:ro" in binds
    assert any(b.endswith(":/opt/mmt/mmt:ro") for b in binds), "the task function's image gets mmt mounted"
    assert run[-2:] == ("img:1", "infinity")


def test_a_command_image_gets_no_mmt_mount_and_the_exec_passes_values_by_name_only():
    plan = local_plan(image="img:1", command="python /train.py", job_dir="/tmp/job")
    settings = images.ContainerSettings()
    run = images.node_container(plan, settings, "n0", 0, "/p").run_argv
    assert not any("/opt/mmt" in arg for arg in run)
    prefix = images.exec_prefix(settings, "n0", {"RANK": "1", "API_TOKEN": "s3cret"}, "/p")
    assert prefix == ["podman", "exec", "-w", "/p", "-e", "API_TOKEN", "-e", "RANK", "n0"]
    assert "s3cret" not in " ".join(prefix)


@pytest.mark.parametrize("mount", ["/data", ":/data", "/data:relative", "/a:/b:ro:extra"])
def test_a_malformed_container_mount_is_refused_naming_the_key(mount):
    with pytest.raises(ConfigError, match="hydra.launcher.container_mounts"):
        images._mount(mount)


def test_container_names_are_valid_for_the_runtimes():
    assert images.container_name("train-1204/x y", "a1", 3) == "mmt-train-1204-x-y-a1-n3"
    # a restart's containers are new ones: the run before may still be being removed under the same job and node
    assert images.container_name("train-1204/x y", "a1", 3, restart=2) == "mmt-train-1204-x-y-a1-n3-r2"


def test_the_same_python_keeps_the_launchers_import_path_as_it_was():
    launcher = ["/somewhere", *sys.path]
    assert payload.import_path(launcher, sorted({sys.prefix, sys.base_prefix, sys.exec_prefix})) == launcher


def test_another_python_keeps_its_own_path_first_and_none_of_the_launchers_interpreter(tmp_path):
    project = tmp_path / "project"
    venv_site = tmp_path / "venv" / "lib" / "site-packages"
    project.mkdir()
    venv_site.mkdir(parents=True)
    path = payload.import_path([str(project), str(venv_site), "/no/such/dir"], [str(tmp_path / "venv")])
    assert path[: len(sys.path)] == sys.path
    assert str(project) in path and str(venv_site) not in path and "/no/such/dir" not in path


def test_a_hydra_plugin_missing_where_the_rank_runs_does_not_fail_reading_the_payload(tmp_path):
    import enum

    module = type(sys)("hydra_plugins.not_installed_here")
    Direction = enum.Enum("Direction", {"minimize": 1}, module=module.__name__)  # an enum, as optuna's sweeper has
    module.Direction = Direction
    sys.modules[module.__name__] = module
    try:
        data = pickle.dumps({"direction": Direction.minimize})
    finally:
        del sys.modules[module.__name__]
    import io

    read = payload._PayloadUnpickler(io.BytesIO(data)).load()
    assert type(read["direction"]).__name__ == "Direction"
    with pytest.raises(ModuleNotFoundError):  # anything else that is missing still fails loudly
        payload._PayloadUnpickler(io.BytesIO(pickle.dumps(pickle.PickleError).replace(b"pickle", b"pickla"))).load()
