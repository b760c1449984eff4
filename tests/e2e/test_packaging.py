"""The plugin as installed: discovery in a fresh interpreter, config keys, imports kept light, the CPU build of torch.
(The config classes themselves: tests/unit/test_packaging.py.)"""

import shutil
import subprocess
import sys

import pytest


def _fresh(code: str) -> str:
    # a new interpreter started outside the repo, so nothing but the installed package can be found
    done = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_hydra_discovers_the_launchers_in_a_fresh_interpreter():
    out = _fresh(
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.launcher import Launcher\n"
        "print(sorted(c.__name__ for c in Plugins.instance().discover(Launcher)))\n"
    )
    assert "MMTLocalLauncher" in out and "MMTSlurmLauncher" in out


def test_launcher_configs_are_in_the_config_store():
    out = _fresh(
        "from hydra.core.config_store import ConfigStore\n"
        "import hydra_plugins.mmt_launcher.config\n"
        "print(sorted(ConfigStore.instance().list('hydra/launcher')))\n"
    )
    assert "mmt_local.yaml" in out and "mmt_slurm.yaml" in out


def test_plugin_discovery_does_not_import_torch_or_lightning():
    # every Hydra app on this interpreter imports the plugin's public modules while scanning for plugins
    out = _fresh(
        "import sys\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.launcher import Launcher\n"
        "Plugins.instance().discover(Launcher)\n"
        "print(sorted(m for m in ('torch', 'lightning', 'submitit') if m in sys.modules))\n"
    )
    assert out.strip() == "[]"


def test_setup_installed_the_cpu_build_of_torch_on_a_host_without_a_gpu():
    """The README's setup must not pull a multi-GB CUDA build where no GPU can use it."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has an NVIDIA driver: a CUDA build of torch is the right one here")
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.version.cuda, torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "None", f"a CUDA build of torch was installed: {done.stdout.strip()}"
