"""What a launch's snapshot costs (docs/snapshots.md), side by side with the ways peers copy a project, in one run.

(a) The snapshot of a project of N small files (a git repo, every file committed, ~600 bytes each), as whole
    commands, alternating:
      mmt first      mmt's snapshot into an empty store (every file read, copied once, the tree hard-linked)
      mmt again      the next launch of the unchanged project (its store kept: nothing read, nothing written)
      mmt one edit   the next launch after one file changed (that file copied, a new tree of links)
      python + imports  the interpreter start and the imports alone: the floor of the three above
      git archive    `git archive HEAD | tar -x`: NeMo-Run's GitArchivePackager (committed files only)
      rsync          `rsync -a` into an empty dir: SkyPilot's workdir sync, at its defaults
      cp -r          a copy by hand
(b) A sweep of 100 trivial jobs on cluster=local (benchmarks/sweep_app.py, from this repo: its snapshot is the
    repo's), from the command's start to its exit, with the snapshot (the default) and without
    (hydra.launcher.snapshot.enabled=false), alternating.

    python benchmarks/bench_snapshot.py                      # both parts, 1,000 and 10,000 files
    python benchmarks/bench_snapshot.py --part files --files 1000 --rounds 5
    python benchmarks/bench_snapshot.py --part sweep --points 100 --rounds 3
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict

from _timing import alternate, report, run

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

# one snapshot of a project, as a launch takes it: listing, size check, store (no Hydra app around it)
TAKE = """
import sys
from mmt.records.snapshot_files import list_project
from mmt.records.snapshot_store import SnapshotStore
from pathlib import Path
project = list_project(sys.argv[1], (), ())
SnapshotStore(Path(sys.argv[2])).take(project)
"""


def make_project(root: Path, files: int) -> None:
    """``files`` small Python files in folders of 100, committed."""
    for i in range(files):
        folder = root / f"pkg{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i % 100:03d}.py").write_text(f"# module {i}\n" + "VALUE = " + repr("x" * 560) + "\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "p"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def file_variants(project: Path) -> Dict[str, Callable[[Path], None]]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "launcher_plugin")}
    kept = Path(tempfile.mkdtemp(prefix="kept-store-", dir=project.parent))
    edited = Path(tempfile.mkdtemp(prefix="edited-store-", dir=project.parent))
    # the edits go to a copy of its own: "mmt again" always finds the project as its last launch left it
    copy_of = project.parent / f"{project.name}-edited"
    shutil.copytree(project, copy_of, symlinks=True)
    target = copy_of / "pkg000" / "mod000.py"

    def take(store: Path, source: Path = project) -> None:
        run([PY, "-c", TAKE, str(source), str(store)], env=env)

    def first(scratch: Path) -> None:
        take(Path(tempfile.mkdtemp(dir=scratch)))

    def again(scratch: Path) -> None:
        take(kept)

    def one_edit(scratch: Path) -> None:
        target.write_text(target.read_text() + "#\n")
        take(edited, copy_of)

    def floor(scratch: Path) -> None:  # the interpreter and the imports, taking nothing: what every mmt figure holds
        run(
            [
                PY,
                "-c",
                TAKE.replace("SnapshotStore(Path(sys.argv[2])).take(project)", "").replace(
                    "project = list_project(sys.argv[1], (), ())", ""
                ),
            ],
            env=env,
        )

    def git_archive(scratch: Path) -> None:
        out = tempfile.mkdtemp(dir=scratch)
        run(["sh", "-c", f"git -C {project} archive HEAD | tar -x -C {out}"])

    def rsync(scratch: Path) -> None:
        run(["rsync", "-a", "--exclude=.git", f"{project}/", tempfile.mkdtemp(dir=scratch)])

    def copy(scratch: Path) -> None:
        run(["cp", "-r", str(project), str(Path(tempfile.mkdtemp(dir=scratch)) / "p")])

    return {
        "mmt first": first,
        "mmt again": again,
        "mmt one edit": one_edit,
        "python + imports": floor,
        "git archive": git_archive,
        "rsync": rsync,
        "cp -r": copy,
    }


def sweep_variants(points: int, home: Path) -> Dict[str, Callable[[Path], None]]:
    env = {**os.environ, "MMT_HOME": str(home)}

    def sweep(snapshot: bool) -> Callable[[Path], None]:
        def one(scratch: Path) -> None:
            sweep_dir = tempfile.mkdtemp(dir=scratch)
            run(
                [PY, "benchmarks/sweep_app.py", "-m", "hydra/launcher=mmt_local", f"+x=range({points})"]
                + [f"hydra.sweep.dir={sweep_dir}", f"hydra.launcher.snapshot.enabled={str(snapshot).lower()}"]
                + ["hydra.launcher.metrics_interval_s=0", "hydra.launcher.console=none"],
                cwd=REPO,
                env=env,
            )

        return one

    return {"sweep with snapshot": sweep(True), "sweep without": sweep(False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["files", "sweep", "both"], default="both")
    parser.add_argument("--files", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    (scratch / "runs").mkdir()
    try:
        if args.part in ("files", "both"):
            for count in args.files:
                project = scratch / f"project-{count}"
                make_project(project, count)
                print(f"\n(a) a project of {count:,} files")
                times = alternate(file_variants(project), args.rounds, scratch / "runs")
                ratios = {
                    "first/git archive": ("mmt first", "git archive"),
                    "first/rsync": ("mmt first", "rsync"),
                    "again/git archive": ("mmt again", "git archive"),
                    "one edit/git archive": ("mmt one edit", "git archive"),
                }
                figures[f"files_{count}"] = report(times, ratios, None, rounds=args.rounds, files=count)
        if args.part in ("sweep", "both"):
            print(f"\n(b) a sweep of {args.points} trivial jobs on cluster=local")
            variants = sweep_variants(args.points, scratch / "home")
            times = alternate(variants, max(1, args.rounds // 2), scratch / "runs")
            ratios = {"with/without": ("sweep with snapshot", "sweep without")}
            figures["sweep"] = report(times, ratios, None, rounds=max(1, args.rounds // 2), points=args.points)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
