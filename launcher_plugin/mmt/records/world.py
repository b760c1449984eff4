"""An elastic job's world (``num_nodes=MIN:MAX``, docs/elastic.md): which of its nodes form it now, and every change.

* ``<attempt>/world.json`` (:class:`World`): the generation, its nodes (by slot: a node's place when the job started)
  in node-rank order, and its state. ``forming``: the coordinator (the backend that watches the job) has decided a
  new world; every node agent in it stops its ranks and says so (``world.ended.<slot>.<generation>``). ``running``:
  each agent's ranks for it are in ``node.<slot>.g<generation>.pkl``, and the agents start them. ``done``: training
  is over; a restored node still waiting to join exits. Written atomically
  by the coordinator only, read by the node agents.
* ``<attempt>/world.ready.<slot>``: a node restored after it was lost has its agent up (the preload imported) and
  waits to join; ``<attempt>/checkpointed``: touched by the ranks after each checkpoint (``MMT_CHECKPOINT_MARK``):
  the coordinator adds ready nodes right after one.
* ``<job dir>/world.jsonl`` (:class:`WorldChange`, a line each): what changed, when, the world before and after,
  the batch split before and after, and how long from the loss to training again; ``mmt inspect``, the page and
  ``result.json`` read it.
"""

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmt.core.jobdir import Attempt, JobDir, read_json, write_atomic
from mmt.planning.plan import JobPlan

# done: training is over (every node of the last world ended well): a spare still waiting to join exits
FORMING, RUNNING, DONE = "forming", "running", "done"


@dataclass(frozen=True)
class World:
    generation: int
    # the node slots in the world, in node-rank order (slot: the node's index when the job started)
    slots: Tuple[int, ...]
    state: str

    def node_rank(self, slot: int) -> Optional[int]:
        return self.slots.index(slot) if slot in self.slots else None

    def write(self, attempt: Attempt) -> None:
        data = {"generation": self.generation, "slots": list(self.slots), "state": self.state}
        write_atomic(attempt.world_file, json.dumps(data).encode(), private=True)

    @classmethod
    def read(cls, attempt: Attempt) -> Optional["World"]:
        data = read_json(attempt.world_file)
        if data is None:
            return None
        return cls(int(data["generation"]), tuple(int(slot) for slot in data["slots"]), str(data["state"]))


def mark_ended(attempt: Attempt, slot: int, generation: int, code: int) -> None:
    """A node agent: its ranks of world ``generation`` are all gone, with this code (0: they all succeeded)."""
    write_atomic(attempt.world_ended(slot, generation), str(code).encode(), private=True)


def mark_ready(attempt: Attempt, slot: int) -> None:
    """A restored node's agent: its preload is imported; it waits to join the next world."""
    write_atomic(attempt.world_ready(slot), str(os.getpid()).encode(), private=True)


def ready_at(attempt: Attempt, slot: int) -> Optional[float]:
    """When node ``slot``'s restored agent said it is ready (None: not yet)."""
    try:
        return attempt.world_ready(slot).stat().st_mtime
    except FileNotFoundError:
        return None


def ended_code(attempt: Attempt, slot: int, generation: int) -> Optional[int]:
    try:
        return int(attempt.world_ended(slot, generation).read_text())
    except (FileNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class WorldChange:
    """One change of an elastic job's world."""

    generation: int  # the world formed by the change (in its run: a restart starts again at world 0)
    at: float  # when the coordinator saw the loss (or the join), wall clock
    lost: Tuple[int, ...]  # node slots lost
    joined: Tuple[int, ...]
    nodes_before: int
    nodes_after: int
    world_before: int
    world_after: int
    batch_before: Optional[str] = None
    batch_after: Optional[str] = None
    # when the new world's ranks were started, and its first training step after the change (None: not seen)
    formed_at: Optional[float] = None
    training_at: Optional[float] = None
    restart: int = 0  # the job's run (MMT_RESTART_COUNT) whose world changed

    @property
    def to_training_s(self) -> Optional[float]:
        return None if self.training_at is None else self.training_at - self.at

    def describe(self) -> str:
        what = []
        if self.lost:
            what.append("lost node " + ", ".join(map(str, self.lost)))
        if self.joined:
            what.append("node " + ", ".join(map(str, self.joined)) + " joined")
        again = "" if self.to_training_s is None else f"; training again {self.to_training_s:.1f} s after"
        run = f" of run {self.restart}" if self.restart else ""
        return (
            f"world {self.generation}{run}: {' and '.join(what)}: {self.nodes_before} -> {self.nodes_after} nodes, "
            f"{self.world_before} -> {self.world_after} ranks{again}"
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["lost"], data["joined"] = list(self.lost), list(self.joined)
        data["to_training_s"] = self.to_training_s
        return data

    @classmethod
    def of(cls, data: Any) -> Optional["WorldChange"]:
        if not isinstance(data, dict):
            return None
        fields: Dict[str, Any] = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        for key in ("lost", "joined"):
            fields[key] = tuple(fields.get(key) or ())
        try:
            return cls(**fields)
        except TypeError:
            return None


def record_change(job_dir: JobDir, change: WorldChange) -> None:
    """Add or update (the same run's same generation) a change in the job's ``world.jsonl``."""
    key = (change.restart, change.generation)
    changes = [old for old in read_changes(job_dir) if (old.restart, old.generation) != key] + [change]
    text = "".join(json.dumps(one.to_dict()) + "\n" for one in sorted(changes, key=lambda c: (c.restart, c.generation)))
    write_atomic(job_dir.world_changes, text.encode())


def read_changes(job_dir: JobDir) -> List[WorldChange]:
    try:
        lines = job_dir.world_changes.read_text().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            change = WorldChange.of(json.loads(line))
        except ValueError:
            continue
        if change is not None:
            found.append(change)
    return found


def shape(devices: int, changes: Sequence[WorldChange], restart: int) -> Optional[str]:
    """An elastic job whose run ``restart`` changed its world, as every view shows it: ``3 -> 2 x 2``,
    ``3 -> 2 -> 3 x 2`` (the nodes of each world; after three changes, the first and the last: ``3 -> ... -> 2 x 2``);
    None when that run's world never changed."""
    changes = [change for change in changes if change.restart == restart]
    if not changes:
        return None
    # its first world: fewer than the plan's nodes where SLURM gave fewer (--nodes=MIN-MAX)
    worlds = [changes[0].nodes_before, *(change.nodes_after for change in changes)]
    shown = [str(count) for count in worlds] if len(worlds) <= 4 else [str(worlds[0]), "...", str(worlds[-1])]
    return f"{' -> '.join(shown)} x {devices}"


def record_failure(attempt: Attempt, why: str) -> None:
    """The coordinator: the world cannot form again (too few nodes left), and why, for the run's conclusion."""
    write_atomic(attempt.world_failed, why.encode(), private=True)


def read_failure(attempt: Attempt) -> Optional[str]:
    try:
        return attempt.world_failed.read_text()
    except FileNotFoundError:
        return None


def last_world_plan(plan: JobPlan, attempt: Attempt) -> JobPlan:
    """An elastic job's plan for the world that ran last (its processes' records are that world's); any other
    job's plan as it is."""
    world = World.read(attempt) if plan.elastic is not None else None
    if world is None or world.state == FORMING or len(world.slots) == plan.num_nodes:
        return plan
    return plan.at_world(len(world.slots), world.generation)
