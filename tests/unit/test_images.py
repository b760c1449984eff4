"""The local backend's container command lines and refusals that need no runtime, and how a rank in another Python
(an image's) reads its payload. The runs themselves: tests/e2e/test_images.py."""

import pickle
import subprocess
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


# ------------------------------------------------------------------------------------------------ what an image holds

OURS = f"{sys.version_info.major}.{sys.version_info.minor}"
MARK = images._MARK
FULL = f"""{MARK} shell yes
{MARK} sleep yes
{MARK} python {OURS} cpython
{MARK} module cloudpickle yes
{MARK} module hydra yes
{MARK} module omegaconf yes
{MARK} module torch yes
{MARK} module lightning no
"""


def test_the_probe_s_answer_is_read_line_by_line_ignoring_what_else_the_image_prints():
    facts = images.parse_facts("motd from the image's profile\n" + FULL + "some warning\n")
    assert facts.shell and facts.sleep and facts.python_found and facts.python == OURS
    assert facts.implementation == "cpython"
    assert facts.modules == {"cloudpickle": True, "hydra": True, "omegaconf": True, "torch": True, "lightning": False}


def test_a_shell_alone_has_no_sleep_and_no_python3():
    facts = images.parse_facts(f"{MARK} shell yes\n{MARK} sleep no\n{MARK} no-python\n")
    assert facts.shell and facts.sleep is False and not facts.python_found and facts.python is None


def test_a_python3_that_does_not_run_is_found_but_has_no_version():
    facts = images.parse_facts(f"{MARK} shell yes\n{MARK} sleep yes\n{MARK} python-failed\n")
    assert facts.python_found and facts.python is None


def test_an_image_without_a_shell_is_answered_by_its_python3_alone():
    said = f"{MARK} python 3.9 pypy\n{MARK} module hydra no\n"
    facts = images.parse_facts(said, python_found=True)
    assert not facts.shell and facts.sleep is None and facts.python == "3.9" and facts.implementation == "pypy"
    assert facts.modules == {"hydra": False}
    # the runtime found no python3 to run (126, 127): nothing said
    assert not images.parse_facts("", python_found=False).python_found


def test_the_probe_scripts_answer_in_a_real_shell_and_python3_here():
    """The same scripts the image runs, run by this host's sh and python3 (no container): what they print parses."""
    done = subprocess.run(
        ["sh", "-c", images._SHELL_PROBE, "sh", "json", "mmt_no_such_module"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    python3 = subprocess.run(
        ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.strip()
    facts = images.parse_facts(done.stdout)
    assert facts.shell and facts.sleep is True and facts.python == python3
    assert facts.modules == {"json": True, "mmt_no_such_module": False}


def _refusal(facts: images.ImageFacts, **plan: object) -> str:
    fields: dict = dict(image="img:1", command=None)
    fields.update(plan)
    [error] = facts.problems(local_plan(**fields), "podman")
    return str(error)


def test_a_command_in_an_image_without_sleep_is_refused_naming_image_and_sleep():
    facts = images.parse_facts(f"{MARK} shell yes\n{MARK} sleep no\n{MARK} no-python\n")
    line = _refusal(facts, command="echo hi")
    assert line.startswith("Invalid image='img:1': it has no sleep") and "infinity" in line and "HINT:" in line
    assert "\n" not in line
    # the task function's container runs python3, not sleep: there it is python3 that is missing
    assert "no python3" in _refusal(facts)


def test_a_command_in_an_image_without_a_shell_is_refused_naming_sh():
    facts = images.parse_facts(f"{MARK} python {OURS} cpython\n", python_found=True)
    assert _refusal(facts, command="echo hi").startswith("Invalid image='img:1': it has no sh,")


def test_a_python3_of_another_minor_version_is_refused_naming_both_versions():
    facts = images.parse_facts(FULL.replace(f"python {OURS} cpython", "python 3.9 pypy"))
    line = _refusal(facts)
    assert line.startswith("Invalid image='img:1': its python3 is 3.9 (pypy), the launcher's is " + OURS)
    assert "pickled" in line and "HINT:" in line and "\n" not in line
    assert facts.problems(local_plan(image="img:1", command="python3 /train.py"), "podman") == []  # a command's own


def test_a_library_the_ranks_import_that_the_image_lacks_is_refused_naming_it():
    facts = images.parse_facts(FULL.replace("module cloudpickle yes", "module cloudpickle no"))
    line = _refusal(facts)
    assert "has no cloudpickle," in line and "pip install cloudpickle" in line
    # hydra is hydra-core to pip; Lightning is needed where the job's preload names it (the recipes' does)
    facts = images.parse_facts(FULL.replace("module hydra yes", "module hydra no"))
    assert "has no hydra-core," in _refusal(facts)
    facts = images.parse_facts(FULL)  # lightning: no
    assert facts.problems(local_plan(image="img:1", command=None, preload=("torch",)), "podman") == []
    assert "has no lightning," in _refusal(facts, preload=("torch", "lightning.pytorch"))


def test_the_preload_s_own_packages_that_the_mounts_bring_are_not_asked_of_the_image(tmp_path, monkeypatch):
    (tmp_path / "myapp").mkdir()
    (tmp_path / "helpers.py").write_text("")
    monkeypatch.chdir(tmp_path)  # the project dir, mounted at its own path
    plan = local_plan(image="img:1", preload=("torch.distributed", "myapp.model", "helpers", "mmt.core", "xformers"))
    assert images._needed(plan) == ("hydra", "omegaconf", "cloudpickle", "torch", "xformers")


def test_kept_facts_of_another_shape_are_asked_again():
    assert images.ImageFacts.from_json("ok") is None  # an older mmt's answer
    assert images.ImageFacts.from_json({"shell": True}) is None
    facts = images.parse_facts(FULL)
    assert images.ImageFacts.from_json(facts.to_json()) == facts


class _Runtime:
    """subprocess.run for ``podman``: an image that is there (``image inspect``) and the probe's answer (``run``)."""

    def __init__(self, answer: str) -> None:
        self.answer, self.calls = answer, []

    def __call__(self, argv, **_kwargs):
        self.calls.append(argv[1])
        out = "sha256:abc\n" if argv[1] == "image" else self.answer
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_an_image_is_asked_once_and_its_answer_kept_by_its_id(tmp_path, monkeypatch):
    monkeypatch.setenv("MMT_HOME", str(tmp_path))
    runtime = _Runtime(FULL)
    monkeypatch.setattr(images.subprocess, "run", runtime)
    # the runtime is as installed as its answers are made up: the unit tier runs before CI installs podman
    monkeypatch.setattr(images.shutil, "which", lambda name: f"/usr/bin/{name}")
    plan = local_plan(image="img:1", command=None, preload=("torch",))
    images._image_facts.cache_clear()
    assert images.problems(plan, images.ContainerSettings()) == []
    assert runtime.calls == ["image", "run"]  # one container answers every question
    images._image_facts.cache_clear()  # another launch
    assert images.problems(plan, images.ContainerSettings()) == []
    assert runtime.calls == ["image", "run", "image"], "a kept answer costs no container"
    # a module the image was never asked about (another preload): asked again, once
    images._image_facts.cache_clear()
    runtime.answer = FULL + f"{MARK} module xformers no\n"
    said = images.problems(local_plan(image="img:1", command=None, preload=("xformers",)), images.ContainerSettings())
    assert runtime.calls[3:] == ["image", "run"] and "has no xformers," in str(said[0])
    images._image_facts.cache_clear()


def test_a_command_s_process_in_its_container_is_found_by_its_job_run_and_place():
    from mmt.worker.command import command_tags

    env = {"MMT_JOB_ID": "j1", "MMT_RESTART_COUNT": "0", "RANK": "3", "NODE_RANK": "1", "PATH": "/bin"}
    assert command_tags(env) == {"MMT_JOB_ID": "j1", "MMT_RESTART_COUNT": "0", "RANK": "3"}
    per_node = {"MMT_JOB_ID": "j1", "MMT_RESTART_COUNT": "1", "NODE_RANK": "1"}  # a per-node command: no RANK
    assert command_tags(per_node) == per_node
    assert command_tags({"RANK": "0"}) == {}  # outside a job: nothing to find
