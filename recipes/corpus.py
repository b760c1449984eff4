"""The language-model corpus every recipe trains on, built offline from text that ships with Python.

``lightning.pytorch.demos.WikiText2`` downloads WikiText-2 from GitHub, and offline it leaves an empty file that
breaks every later run. We write CPython's bundled documentation topics (``pydoc_data.topics``: ~65k words,
~8.8k distinct) into the file it expects, then use the demo dataset unchanged (download=False).
"""

import os
import tempfile
from pathlib import Path
from typing import Tuple

CORPUS_FILE = "wikitext-2.txt"


def ensure_corpus(data_dir: str) -> Path:
    """``<data_dir>/wikitext-2.txt``, written once, atomically (ranks may race to create it)."""
    path = Path(data_dir) / CORPUS_FILE
    if path.exists() and path.stat().st_size > 0:
        return path
    from pydoc_data.topics import topics

    lines = []
    for name in sorted(topics):
        text = " ".join(topics[name].split())
        if text:
            lines.append(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{CORPUS_FILE}.")
    with os.fdopen(fd, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def load_splits(data_dir: str, block_size: int, val_fraction: float, seed: int) -> Tuple[object, object, int]:
    """(train, val, vocab_size): WikiText2 blocks split by a seeded generator, identical on every rank."""
    import torch
    from lightning.pytorch.demos import WikiText2
    from torch.utils.data import random_split

    ensure_corpus(data_dir)
    dataset = WikiText2(data_dir=Path(data_dir), block_size=block_size, download=False)
    n_val = max(1, int(len(dataset) * val_fraction))
    train, val = random_split(dataset, [len(dataset) - n_val, n_val], generator=torch.Generator().manual_seed(seed))
    return train, val, dataset.vocab_size


def weights_digest(module: object) -> str:
    """SHA-256 of every parameter's bytes, in order: equal on two ranks iff their weights are identical."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():  # type: ignore[attr-defined]
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
