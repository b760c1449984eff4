"""recipe=llm's data step: a BPE tokenizer trained on text that ships with Python, the corpus tokenized into blocks,
and the blocks written as LitData chunks (``litdata.optimize``) once per dataset; the ranks then stream them.

Nothing is downloaded: the corpus is CPython's bundled documentation (``recipes.corpus``; ``data.docstrings`` adds
the standard library's docstrings) and the tokenizer is trained on it with ``tokenizers`` (byte-level BPE, so every
byte sequence encodes).

**Prepared once, cached by content.** A dataset lives in ``<cache_dir>/<key>/``, where the key is a digest of the
corpus's text, the settings that change the bytes and the versions of the libraries that write them
(``recipes.llm_config.DataSpec.key``). A sweep or a restart finds it and does nothing, once it has checked the
chunks against LitData's index (a chunk missing or cut short, as a full disk or a partial copy leaves them): a
damaged dataset is set aside and built again, under the same lock. Two jobs that need it at the
same moment serialize on an ``flock`` of ``<cache_dir>/.<key>.lock``: the first builds it into a temp dir next to
it and renames the dir into place (one atomic ``rename``, so a reader sees the whole dataset or none of it); the
second then finds it. A build killed half-way leaves only its temp dir, removed by the next build. Each build
appends one line to ``<cache_dir>/prepared.jsonl`` (what, where, how long): the audit trail the tests count.

**Who prepares.** LitData's multi-node ``optimize`` into one local directory is broken in 0.2.76 (as reported in the
issue that asked for this recipe: its merge of the nodes' index files crashes, or one node's ``mode="overwrite"``
wipes the other's chunks), and the data is small next to the training: so one process prepares it and the others
wait. In the recipe that is global rank 0, behind a barrier, when the cache is on a shared filesystem
(``data.prepare_on=job``), or local rank 0 of every node when it is node-local disk (``prepare_on=node``: every node
builds the same tokenizer and chunks; only the index's ``updated_at`` differs). The build runs in a child process
with the rank variables removed: LitData's chunk writer reads WORLD_SIZE, GLOBAL_RANK and NNODES
(``_DistributedEnv.detect``) and would act as one writer of the job's world. ``python -m recipes.llm_data`` runs the
same step before any rank starts.

**Every sample once per epoch.** Samples are ``block_size`` tokens (``TokensLoader``). LitData drops samples so
that every rank gets as many as the others (``drop_last`` is forced on in a distributed run), so the train split is
cut to a multiple of ``blocks_multiple`` samples (64 by default: any world of 1 to 64 ranks divides it): a world
that divides it reads every sample, each on exactly one rank, every epoch.
"""

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from recipes.llm_config import DataSpec

PREPARED_LOG = "prepared.jsonl"
EOS = "<eos>"
# what a child process must not inherit: LitData would take the job's world for the optimizer's
RANK_VARS = (
    "WORLD_SIZE",
    "RANK",
    "GLOBAL_RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "NNODES",
    "NUM_NODES",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def corpus_lines(spec: DataSpec) -> List[str]:
    """The documentation topics, and the standard library's docstrings when ``spec.docstrings``."""
    from recipes.corpus import _docstring_lines, _topic_lines

    lines = _topic_lines()
    if spec.docstrings:
        lines.extend(_docstring_lines())
    return lines


def _versions() -> Dict[str, str]:
    return {name: version(name) for name in ("tokenizers", "litdata")}


def dataset_dir(spec: DataSpec, lines: Optional[List[str]] = None) -> Path:
    """Where ``spec``'s dataset is (or will be) in the cache."""
    text = "\n".join(corpus_lines(spec) if lines is None else lines)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return Path(spec.cache_dir).absolute() / spec.key(digest, _versions())


def is_ready(path: Path) -> bool:
    return (path / "meta.json").is_file()


SPLITS = ("train", "val")


def damage(path: Path) -> Optional[str]:
    """What is wrong with a dataset that says it is ready, or None: every chunk LitData's ``index.json`` of each
    split lists must be there, whole (its ``chunk_bytes``), and the tokenizer too. A disk that filled mid-copy, or a
    partial rsync to node-local disk, leaves exactly such a dataset; LitData would then wait for the missing bytes as
    for a download that hung."""
    if not (path / "tokenizer.json").is_file():
        return f"{path / 'tokenizer.json'} is missing"
    for split in SPLITS:
        index = path / split / "index.json"
        try:
            chunks = json.loads(index.read_text())["chunks"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"{index} is missing or not LitData's index"
        for chunk in chunks:
            try:
                name, expected = str(chunk["filename"]), int(chunk["chunk_bytes"])
            except (KeyError, TypeError, ValueError):
                return f"{index} lists a chunk without its filename and size"
            file = path / split / name
            try:
                size = file.stat().st_size
            except OSError:
                return f"{file} is missing ({index} lists it)"
            if size != expected:
                return f"{file} has {size:,} bytes where {index} says {expected:,}"
    return None


def _set_aside(target: Path, why: str) -> None:
    """A damaged dataset moves out of the way (kept for a look, never read again); the build then makes it anew."""
    aside = target.parent / f".{target.name}.damaged-{int(time.time())}-{os.getpid()}"
    os.rename(target, aside)
    print(f"llm data: {why}: rebuilding {target.name} (the damaged copy is in {aside})", file=sys.stderr, flush=True)


def prepare(spec: DataSpec) -> Path:
    """The dataset's dir, built first if the cache does not have it whole (see the module's docstring)."""
    lines = corpus_lines(spec)
    target = dataset_dir(spec, lines)
    if is_ready(target) and damage(target) is None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job may be building it: wait for it, then find it
        if is_ready(target):
            why = damage(target)
            if why is None:
                return target
            _set_aside(target, why)  # under the lock: no other build or reader of this process's kind races it
        for stale in target.parent.glob(f".{target.name}.tmp-*"):  # a build that was killed: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        temp = target.parent / f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}"
        started = time.perf_counter()
        meta = _build(spec, lines, temp)
        os.rename(temp, target)  # the whole dataset appears at once
        record = {
            "key": target.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "job_dir": os.environ.get("MMT_JOB_DIR"),
            "seconds": round(time.perf_counter() - started, 2),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **{k: meta[k] for k in ("train_samples", "val_samples", "tokens")},
        }
        with open(target.parent / PREPARED_LOG, "a") as log:
            log.write(json.dumps(record) + "\n")
    return target


def _build(spec: DataSpec, lines: List[str], out: Path) -> Dict[str, Any]:
    import litdata
    import numpy as np
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    eos = tokenizer.token_to_id(EOS)
    ids = np.fromiter(
        (token for encoding in tokenizer.encode_batch(lines) for token in [*encoding.ids, eos]), dtype=np.int32
    )
    samples = len(ids) // spec.block_size
    val = max(1, int(samples * spec.val_fraction))
    train = (samples - val) // spec.blocks_multiple * spec.blocks_multiple
    if train == 0:
        raise ValueError(
            f"the corpus has {samples} samples of {spec.block_size} tokens, too few for one group of "
            f"{spec.blocks_multiple} after the validation split. HINT: recipe.data.docstrings=true triples the text"
        )
    blocks = ids[: samples * spec.block_size].reshape(samples, spec.block_size)
    splits = {"train": blocks[:train], "val": blocks[samples - val :]}
    for name, split in splits.items():
        groups = [split[start : start + spec.chunk_blocks] for start in range(0, len(split), spec.chunk_blocks)]
        litdata.optimize(
            fn=_flat,
            inputs=groups,
            output_dir=str(out / name),
            chunk_size=spec.chunk_blocks * spec.block_size,  # in tokens: TokensLoader's unit
            item_loader=litdata.TokensLoader(),
            num_workers=1,
            mode="overwrite",
            verbose=False,
        )
    meta = {
        "spec": asdict(spec),
        "versions": _versions(),
        "vocab_size": tokenizer.get_vocab_size(),
        "tokens": int(len(ids)),
        "train_samples": int(train),
        "val_samples": int(val),
        "dropped_samples": int(samples - val - train),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _flat(group: Any) -> Any:
    """One optimize input: a group of samples, flattened into the token stream TokensLoader cuts back into them."""
    import torch

    return torch.from_numpy(group.reshape(-1).copy())


def prepare_in_child(spec: DataSpec, timeout_s: float) -> Path:
    """``prepare`` in a fresh process without the rank variables (LitData's optimizer reads them)."""
    env = {key: value for key, value in os.environ.items() if key not in RANK_VARS and not key.startswith("DATA_OPT")}
    done = subprocess.run(
        [sys.executable, "-m", "recipes.llm_data", "--spec", json.dumps(asdict(spec))],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the data step failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


def samples(path: Path, block_size: int) -> Iterator[Any]:
    """Every sample of a split, in order, read in this process (no ranks): what the tests compare the ranks with."""
    import litdata

    yield from litdata.StreamingDataset(str(path), item_loader=litdata.TokensLoader(block_size=block_size))


def digest(sample: Any) -> str:
    """A sample's identity: the digest of its token ids (what ``recipe.trace_reads`` records per sample)."""
    return hashlib.sha1(sample.numpy().astype("int32").tobytes()).hexdigest()[:16]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Build recipe=llm's dataset into its cache (once) and print its dir")
    parser.add_argument("--spec", help="DataSpec as JSON (the recipe's data section)")
    parser.add_argument("--cache-dir", default="data/llm")
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=65)
    parser.add_argument("--docstrings", action="store_true")
    args = parser.parse_args(argv)
    if args.spec:
        spec = DataSpec.of(json.loads(args.spec))
    else:
        spec = DataSpec(args.cache_dir, args.vocab_size, args.block_size, docstrings=args.docstrings)
    print(prepare(spec), flush=True)


if __name__ == "__main__":
    main()
