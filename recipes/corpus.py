"""The language-model corpus every recipe trains on, built offline from text that ships with Python.

``lightning.pytorch.demos.WikiText2`` downloads WikiText-2 from GitHub, and offline it leaves an empty file that
breaks every later run. We write CPython's bundled documentation topics (``pydoc_data.topics``: ~65k words,
~8.8k distinct) into the file it expects, then use the demo dataset unchanged (download=False).

The seed's example scripts need a larger file (they split off 4000 samples): ``python -m recipes.corpus data
--min-blocks 4100`` adds docstrings of the standard library until it is large enough.
"""

import argparse
import ast
import os
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

CORPUS_FILE = "wikitext-2.txt"


def _topic_lines() -> List[str]:
    from pydoc_data.topics import topics

    return [text for text in (" ".join(topics[name].split()) for name in sorted(topics)) if text]


def _docstring_lines() -> Iterator[str]:
    """Docstrings of the standard library's top-level modules, parsed (never imported: some modules act on import)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for source in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(source.read_text(encoding="utf8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = " ".join((ast.get_docstring(node) or "").split())
                if text:
                    yield text


def _blocks(tokens: int, block_size: int) -> int:
    return tokens // block_size - 1  # WikiText2.__len__; every line also gets an <eos> token


def _count_tokens(path: Path) -> int:
    with open(path, encoding="utf8") as handle:
        return sum(len(line.split()) + 1 for line in handle)


def corpus_lines(min_blocks: Optional[int] = None, block_size: int = 35) -> List[str]:
    """The documentation topics, then (only when ``min_blocks`` asks for more) standard-library docstrings."""
    lines = _topic_lines()
    tokens = sum(len(line.split()) + 1 for line in lines)
    if min_blocks is not None and _blocks(tokens, block_size) < min_blocks:
        for line in _docstring_lines():
            lines.append(line)
            tokens += len(line.split()) + 1
            if _blocks(tokens, block_size) >= min_blocks:
                break
        else:
            raise ValueError(
                f"the offline corpus has only {_blocks(tokens, block_size)} blocks of {block_size} "
                f"tokens; {min_blocks} were asked for"
            )
    return lines


def ensure_corpus(data_dir: str, min_blocks: Optional[int] = None, block_size: int = 35) -> Path:
    """``<data_dir>/wikitext-2.txt``, written once, atomically (ranks may race to create it).

    ``min_blocks``: at least this many samples of ``block_size`` tokens. The seed scripts split off 2 x 2000
    samples for validation and test, more than the topics alone hold, so they need ~4100; the recipes keep the
    small default (fast). An existing file is kept when it is large enough (a real WikiText-2 file is).
    """
    path = Path(data_dir) / CORPUS_FILE
    if path.exists() and path.stat().st_size > 0:
        if min_blocks is not None and _blocks(_count_tokens(path), block_size) < min_blocks:
            raise ValueError(
                f"{path} has fewer than {min_blocks} blocks of {block_size} tokens; remove it to "
                f"have a larger offline corpus written"
            )
        return path
    lines = corpus_lines(min_blocks, block_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{CORPUS_FILE}.")
    with os.fdopen(fd, "w", encoding="utf8") as handle:
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


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Write the offline corpus as <data_dir>/wikitext-2.txt")
    parser.add_argument("data_dir")
    parser.add_argument("--min-blocks", type=int, default=None, help="at least this many samples of 35 tokens")
    args = parser.parse_args(argv)
    path = ensure_corpus(args.data_dir, args.min_blocks)
    print(f"{path}: {_blocks(_count_tokens(path), 35)} blocks of 35 tokens")


if __name__ == "__main__":
    main()
