"""Each rank streams its shard of a LitData dataset: every item exactly once per epoch over all ranks.

    python train.py -m command='python examples/frameworks/litdata_stream.py /path/to/optimized' \\
        command_mode=per_rank num_nodes=2 devices=2

LitData reads the rank from GLOBAL_RANK and the node count from NNODES (and the world from WORLD_SIZE), which mmt
sets for every rank: a StreamingDataset built before init_process_group gets the same shard as one built after.
This script builds it both ways, reads two epochs of each, and prints every item it got as one JSON line; after
init_process_group, rank 0 gathers all ranks' items and checks that no item came twice in an epoch and that every
epoch, both ways, covered the same items (that they are all of them: tests/e2e/test_frameworks.py).
Make the data with ``--make DIR [N]`` (litdata.optimize of N small items, 4 to a chunk).
"""

import json
import sys
from collections import Counter

import litdata
import torch.distributed as dist

EPOCHS = 2


def item(index: int) -> dict:
    return {"index": index}


def make(output_dir: str, count: int) -> None:
    litdata.optimize(
        fn=item, inputs=list(range(count)), output_dir=output_dir, chunk_size=4, num_workers=1, mode="overwrite"
    )


def read(data_dir: str, shuffle: bool) -> list:
    dataset = litdata.StreamingDataset(data_dir, shuffle=shuffle, drop_last=False, seed=7)
    return [[int(sample["index"]) for sample in dataset] for _ in range(EPOCHS)]  # one list per epoch


def main(data_dir: str) -> None:
    got = {"before": read(data_dir, shuffle=True)}  # before the process group exists: the environment alone
    dist.init_process_group("gloo")
    got["after"] = read(data_dir, shuffle=True)
    got["after_in_order"] = read(data_dir, shuffle=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    print("litdata " + json.dumps({"rank": rank, **got}), flush=True)
    everyone = [None] * world
    dist.all_gather_object(everyone, got)
    if rank == 0:
        whole = None
        for when in got:
            for epoch in range(EPOCHS):
                seen = Counter(i for ranks in everyone for i in ranks[when][epoch])
                twice = sorted(i for i, n in seen.items() if n > 1)
                assert not twice, f"{when}, epoch {epoch}: items read by more than one rank: {twice}"
                whole = set(seen) if whole is None else whole
                assert set(seen) == whole, f"{when}, epoch {epoch}: {len(seen)} items, not the {len(whole)} of the rest"
        print(f"litdata ok: {world} ranks, every item once per epoch, before and after init_process_group", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "--make":
        make(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 64)
    else:
        main(sys.argv[1])
