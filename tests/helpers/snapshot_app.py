"""A Hydra app of its own in a git repo, for the snapshot tests: every job waits at a gate the test opens, so that
the test can edit, add and delete the app's files after the launch and before the job imports them."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from helpers.processes import TAG_VAR

APP = """
import os
import time
from pathlib import Path

import hydra
from hydra.utils import get_original_cwd, to_absolute_path


@hydra.main(version_base="1.3", config_path="conf", config_name="app")
def main(cfg):
    gate = Path(cfg.gate)
    restart = int(os.environ.get("MMT_RESTART_COUNT", "0"))
    if os.environ.get("RANK", "0") == "0":
        (gate.parent / f"started.{cfg.x}.{restart}").touch()
    deadline = time.time() + 120
    while not gate.exists() and time.time() < deadline:
        time.sleep(0.05)
    if cfg.fail_once and restart == 0:
        raise RuntimeError("failing once, as asked")
    import late  # imported late: edited after the launch
    from tools import util  # a package's submodule, imported late

    try:
        import gone_later  # deleted after the launch
        gone = gone_later.VALUE
    except ModuleNotFoundError:
        gone = None
    try:
        import added_later  # noqa: F401  (added after the launch)
        added = True
    except ModuleNotFoundError:
        added = False
    return {
        "late": late.VALUE,
        "util": util.VALUE,
        "gone": gone,
        "added": added,
        "data": (Path(__file__).parent / "data.txt").read_text().strip(),
        "app_dir": str(Path(__file__).parent),
        "late_file": late.__file__,
        "original_cwd": get_original_cwd(),
        "absolute": to_absolute_path("data.txt"),
        "snapshot_dir": os.environ.get("MMT_SNAPSHOT_DIR"),
    }


if __name__ == "__main__":
    main()
"""

CONF = """
x: 0
gate: ???
fail_once: false
"""


def make_app(root: Path) -> Path:
    """The app, committed, then one uncommitted edit (``late.py``): what the launch must run."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "conf").mkdir(exist_ok=True)
    (root / "tools").mkdir(exist_ok=True)
    (root / "app.py").write_text(APP)
    (root / "conf" / "app.yaml").write_text(CONF)
    (root / "late.py").write_text('VALUE = "committed"\n')
    (root / "gone_later.py").write_text('VALUE = "was there"\n')
    (root / "tools" / "__init__.py").write_text("")
    (root / "tools" / "util.py").write_text('VALUE = "util as launched"\n')
    (root / "data.txt").write_text("data as launched\n")
    (root / ".gitignore").write_text("multirun/\noutputs/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the app")
    (root / "late.py").write_text('VALUE = "uncommitted at launch"\n')
    return root


def edit_after_launch(root: Path) -> None:
    """What `git checkout` of another branch does to a work tree: files edited, added and deleted."""
    (root / "late.py").write_text('VALUE = "edited after the launch"\n')
    (root / "tools" / "util.py").write_text('VALUE = "util edited"\n')
    (root / "gone_later.py").unlink()
    (root / "added_later.py").write_text("VALUE = 1\n")
    (root / "data.txt").write_text("data edited\n")


LAUNCHED = {"late": "uncommitted at launch", "util": "util as launched", "gone": "was there", "added": False}


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def app_run(root: Path, *overrides: str, tag: str, **env: str) -> subprocess.Popen:
    """``python app.py -m ...`` in the app's folder, as a user would type it (its output in ``out.txt`` beside the
    project: a file in it would be part of its snapshot)."""
    out = open(root.parent / "out.txt", "w")
    return subprocess.Popen(
        [sys.executable, "app.py", "-m", *overrides],
        cwd=root,
        env={**os.environ, "PYTHONUNBUFFERED": "1", TAG_VAR: tag, **env},
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )


def results(sweep_dir: Path) -> List[Dict]:
    found = [json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")]
    return sorted(found, key=lambda r: r["job"])
