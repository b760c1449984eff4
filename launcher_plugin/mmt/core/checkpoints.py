"""Checkpoints a rerun or a requeued job resumes from: written atomically, a temp file in the checkpoint's own dir
renamed into place (the recipes' Lightning and Fabric saves through ``mmt.lightning.AtomicCheckpointIO``, the
raw-PyTorch recipe's directly), and checked before resuming, so a file cut short outside mmt's control (a full disk,
a copy interrupted) is reported as such, with what to do, instead of torch's advice about ``weights_only``."""

import os
import zipfile
from pathlib import Path
from typing import Any, Optional

from mmt.core.rank_env import MMT_CHECKPOINT_MARK


class CorruptCheckpointError(RuntimeError):
    """The checkpoint a job would resume from cannot be read."""


def save_atomic(state: Any, path: Path) -> None:
    """``torch.save`` to a temp file in the same dir, then rename: a kill mid-save leaves the previous file."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    mark_checkpointed()


def mark_checkpointed() -> None:
    """Tell an elastic job's coordinator a checkpoint was just written (``MMT_CHECKPOINT_MARK``, set in an elastic
    job only): a node that came back joins the world right after one, so the new world loses no training."""
    mark = os.environ.get(MMT_CHECKPOINT_MARK)
    if mark:
        try:
            Path(mark).touch()
        except OSError:  # the attempt dir is gone (the job is stopping): nothing to tell
            pass


def resume_from(path: Path, resume: bool) -> Optional[Path]:
    """``path`` when the job should resume from it (it exists, ``resume`` is on, and it can be read); None to start
    fresh; CorruptCheckpointError when it exists but cannot be read."""
    if not resume or not path.exists():
        return None
    # torch.save writes a zip archive whose directory is at its end: a file cut short has none (checked without
    # unpickling anything; older, non-zip checkpoints are left to torch)
    with open(path, "rb") as handle:
        zipped = handle.read(4) == b"PK\x03\x04"
    if zipped and not zipfile.is_zipfile(path) or path.stat().st_size == 0:
        raise CorruptCheckpointError(
            f"the checkpoint to resume from, {path} ({path.stat().st_size} bytes), is not a complete checkpoint: it "
            "was probably cut short (a full disk, an interrupted copy). HINT: move it away "
            f"(mv {path} {path}.bad) to start fresh, or run with recipe.resume=false"
        )
    return path
