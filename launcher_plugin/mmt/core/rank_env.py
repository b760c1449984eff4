"""The rank-env contract: the one module that names, builds and reads the variables every rank sees.

The launcher (every backend) builds a process's contract with :func:`contract_env` (inside the full environment that
``mmt.planning.environment.process_env`` assembles); recipes read it back with :meth:`RankInfo.from_env`. Nothing
else in the project spells these variable names.

Contract (N nodes x M processes per node, node n, local index l):

=================  ==========================================================
MASTER_ADDR        node 0's address
MASTER_PORT        a port chosen per job (never a fixed 29500)
NODE_RANK          n (Lightning, torchrun's --node-rank)
GROUP_RANK         n (torchelastic's name for the same)
LOCAL_RANK         l (its presence tells Lightning "processes were created externally")
RANK               n * M + l
WORLD_SIZE         N * M
LOCAL_WORLD_SIZE   M
NUM_NODES          N (the Lightning platform's name)
GLOBAL_RANK        RANK again, where RANK is set (LitData's name)
NNODES             N (LitData's name)
MMT_NODE_ADDRS     every node's address, comma-separated, in node order (MASTER_ADDR is the first)
MMT_NODE_ADDR      this node's own entry of MMT_NODE_ADDRS
MMT_RESTART_COUNT  how many times mmt restarted the job after a failure (0 first); the same on every rank
MMT_MAX_RESTARTS   how many times it may (hydra.launcher.max_restarts): a recipe then checkpoints where it resumes
                   exactly
OMP_NUM_THREADS    cores per node // M, unless the user set it
=================  ==========================================================

A job that names its framework (``hydra.launcher.framework``) also gets that framework's own variables, one
process of the plan being one TensorFlow worker or one JAX process (per-rank: the rank; per-node: the node):

=========================  ===============================================================================
TF_CONFIG                  tensorflow: every worker's own host:port (its node's address, a port held for
                           it), in process order, and this process's index; the cluster part is identical on
                           every process
TF_NUM_INTRAOP_THREADS     tensorflow: OMP_NUM_THREADS, unless the user set it
TF_NUM_INTEROP_THREADS     tensorflow: min(2, that), unless the user set it
JAX_COORDINATOR_ADDRESS    jax: process 0's node address and a port held for the coordinator
JAX_NUM_PROCESSES          jax: the number of processes (JAX does not read it: pass it to initialize())
JAX_PROCESS_ID             jax: this process's index (likewise)
JAX_LOCAL_DEVICE_IDS       jax, per rank: LOCAL_RANK (read by jax.distributed.initialize: one device each)
=========================  ===============================================================================

When the recipe states a global batch size, the launcher resolves its batch plan once and hands it to every
rank (global = WORLD_SIZE x micro x accumulation):

=====================  ================================================================
MMT_GLOBAL_BATCH_SIZE  samples per optimizer step over all ranks
MMT_MICRO_BATCH_SIZE   samples per rank per forward/backward (the DataLoader batch_size)
MMT_GRAD_ACCUM         micro-batches accumulated per optimizer step
=====================  ================================================================

An elastic job (``num_nodes=MIN:MAX``, docs/elastic.md) forms its world again when a node is lost or joins; every
rank of each world also gets:

=====================  ================================================================
MMT_WORLD_GENERATION   how many times the world was formed again (0 first); the same on every rank
MMT_ELASTIC_NODES      the job's node range, ``MIN:MAX`` (NUM_NODES is this world's count)
MMT_CHECKPOINT_MARK    a file to touch after each checkpoint is written: a node that comes back joins right
                       after one (mmt's recipes and ``mmt.lightning.AtomicCheckpointIO`` touch it themselves)
=====================  ================================================================

A command that starts its own local ranks (per-node mode), and any command run per rank, also gets the
topology in the names Lightning reads: ``PL_TRAINER_NUM_NODES``/``PL_TRAINER_DEVICES`` (Trainer defaults) and
``LT_NUM_NODES``/``LT_DEVICES`` (Fabric overrides), so a Trainer or Fabric that hard-codes nothing gets them right.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Collection, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
NODE_RANK = "NODE_RANK"
GROUP_RANK = "GROUP_RANK"
LOCAL_RANK = "LOCAL_RANK"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
NUM_NODES = "NUM_NODES"
OMP_NUM_THREADS = "OMP_NUM_THREADS"
# LitData reads the rank and the node count under these names (litdata.utilities.env._DistributedEnv.detect); without
# GLOBAL_RANK every rank that builds a StreamingDataset before init_process_group streams rank 0's shard
GLOBAL_RANK = "GLOBAL_RANK"
NNODES = "NNODES"
# every node's address in node order, and this node's own
MMT_NODE_ADDRS = "MMT_NODE_ADDRS"
MMT_NODE_ADDR = "MMT_NODE_ADDR"
# a job's framework (hydra.launcher.framework) and the variables mmt writes for it
FRAMEWORK_NONE, TENSORFLOW, JAX = "none", "tensorflow", "jax"
FRAMEWORKS = (FRAMEWORK_NONE, TENSORFLOW, JAX)
TF_CONFIG = "TF_CONFIG"
TF_NUM_INTRAOP_THREADS = "TF_NUM_INTRAOP_THREADS"
TF_NUM_INTEROP_THREADS = "TF_NUM_INTEROP_THREADS"
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
JAX_PROCESS_ID = "JAX_PROCESS_ID"
JAX_LOCAL_DEVICE_IDS = "JAX_LOCAL_DEVICE_IDS"
# restarts after a failure (hydra.launcher.max_restarts): one count for the whole job, never per node (torchrun's
# TORCHELASTIC_RESTART_COUNT is per agent); SLURM's own requeues are counted apart (SLURM_RESTART_COUNT)
MMT_RESTART_COUNT = "MMT_RESTART_COUNT"
MMT_MAX_RESTARTS = "MMT_MAX_RESTARTS"
# hang detection (mmt.core.stacks): the file a rank touches as it makes progress, the file its stack goes to
MMT_HEARTBEAT = "MMT_HEARTBEAT"
MMT_STACKS_FILE = "MMT_STACKS_FILE"
# where the job writes (its Hydra output dir) and which job this is; handy for `command=` scripts
MMT_JOB_DIR = "MMT_JOB_DIR"
MMT_JOB_ID = "MMT_JOB_ID"
# a command's container (a local job with an image): the JSON argv that runs a program in the rank's node container
MMT_CONTAINER_EXEC = "MMT_CONTAINER_EXEC"
# a job with roles (docs/roles.md): the process's role, every role's name (primary first), the JSON file that says
# where each role is; and per role MMT_ROLE_<NAME>_ADDRS (its nodes' addresses) and MMT_ROLE_<NAME>_PORT (a port held
# for it to serve on, on its node 0)
MMT_ROLE = "MMT_ROLE"
MMT_ROLES = "MMT_ROLES"
MMT_ROLES_FILE = "MMT_ROLES_FILE"


def role_addrs_var(role: str) -> str:
    return f"MMT_ROLE_{role.upper()}_ADDRS"


def role_port_var(role: str) -> str:
    return f"MMT_ROLE_{role.upper()}_PORT"


# an elastic job (num_nodes=MIN:MAX): which world this is (0, then one more at each change), and the node range
MMT_WORLD_GENERATION = "MMT_WORLD_GENERATION"
MMT_ELASTIC_NODES = "MMT_ELASTIC_NODES"
MMT_CHECKPOINT_MARK = "MMT_CHECKPOINT_MARK"

# the job's batch plan (only when the recipe states batch.global_size)
MMT_GLOBAL_BATCH_SIZE = "MMT_GLOBAL_BATCH_SIZE"
MMT_MICRO_BATCH_SIZE = "MMT_MICRO_BATCH_SIZE"
MMT_GRAD_ACCUM = "MMT_GRAD_ACCUM"

# What a command (Lightning Trainer/Fabric, torchrun, mp.spawn) needs to know the topology when it
# creates the local ranks itself: Trainer reads PL_TRAINER_<ARG> as defaults, Fabric's LT_* override its arguments.
PER_NODE_TOPOLOGY = {
    "num_nodes": ("PL_TRAINER_NUM_NODES", "LT_NUM_NODES"),
    "devices": ("PL_TRAINER_DEVICES", "LT_DEVICES"),
}

#: names a user may not set through ``env``: the launcher owns them
RESERVED = frozenset(
    {
        MASTER_ADDR,
        MASTER_PORT,
        NODE_RANK,
        GROUP_RANK,
        LOCAL_RANK,
        RANK,
        WORLD_SIZE,
        LOCAL_WORLD_SIZE,
        NUM_NODES,
        GLOBAL_RANK,
        NNODES,
        MMT_NODE_ADDRS,
        MMT_NODE_ADDR,
        MMT_RESTART_COUNT,
        MMT_MAX_RESTARTS,
        TF_CONFIG,
        JAX_COORDINATOR_ADDRESS,
        JAX_NUM_PROCESSES,
        JAX_PROCESS_ID,
        MMT_JOB_DIR,
        MMT_JOB_ID,
        MMT_GLOBAL_BATCH_SIZE,
        MMT_MICRO_BATCH_SIZE,
        MMT_GRAD_ACCUM,
        MMT_WORLD_GENERATION,
        MMT_ELASTIC_NODES,
        MMT_CHECKPOINT_MARK,
        MMT_ROLE,
        MMT_ROLES,
        MMT_ROLES_FILE,
        *(name for names in PER_NODE_TOPOLOGY.values() for name in names),
    }
)

#: the reserved names that belong to a framework: mmt writes them when hydra.launcher.framework asks for them
FRAMEWORK_RESERVED = frozenset({TF_CONFIG, JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID})

# Inherited variables that make a framework believe it runs somewhere else: a stray SLURM_NTASKS makes Lightning
# pick SLURMEnvironment with wrong ranks, TORCHELASTIC_RUN_ID makes it trust RANK/WORLD_SIZE, LT_*/PL_TRAINER_*
# override Trainer/Fabric arguments, LSB_*/JSM_* select LSFEnvironment.
SCRUBBED_PREFIXES = (
    "SLURM_",
    "SLURMD_",
    "SBATCH_",
    "SRUN_",
    "TORCHELASTIC_",
    "LT_",
    "PL_TRAINER_",
    "PL_FABRIC_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "LSB_",
    "JSM_NAMESPACE_",
    "SUBMITIT_",
    "MMT_",
)
# (OMPI_*, PMI_*, PMIX_* above: MPI's own names, never set by mmt either: see docs/frameworks.md.) An inherited
# TF_CONFIG or JAX coordinator would send every rank to another job's workers.
_SCRUB_NAMES = RESERVED | {
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    JAX_LOCAL_DEVICE_IDS,
    "JAX_COORDINATOR_PORT",
    "JAX_COORDINATOR_BIND_ADDRESS",
    # another job's heartbeat and stack file (a launch from inside a job): never this job's
    MMT_HEARTBEAT,
    MMT_STACKS_FILE,
}


def topology_hints(num_nodes: int, local_world_size: int) -> dict[str, str]:
    """The topology in Lightning's own variables, for scripts that construct a Trainer/Fabric themselves."""
    env = {}
    for key, value in (("num_nodes", num_nodes), ("devices", local_world_size)):
        for name in PER_NODE_TOPOLOGY[key]:
            env[name] = str(value)
    return env


def batch_env(global_size: int, micro: int, accumulate: int) -> dict[str, str]:
    """The batch plan as variables: pass it as ``extra`` to :func:`rank_env` / :func:`node_env`."""
    return {MMT_GLOBAL_BATCH_SIZE: str(global_size), MMT_MICRO_BATCH_SIZE: str(micro), MMT_GRAD_ACCUM: str(accumulate)}


def _node_range(raw: Optional[str]) -> Optional[Tuple[int, int]]:
    if not raw:
        return None
    low, _, high = raw.partition(":")
    try:
        return int(low), int(high)
    except ValueError:
        raise ValueError(f"{MMT_ELASTIC_NODES}={raw!r} is not MIN:MAX: the rank environment is corrupt") from None


def elastic_env(generation: int, min_nodes: int, max_nodes: int) -> dict[str, str]:
    """An elastic job's world: pass it as ``extra`` to :func:`contract_env`."""
    return {MMT_WORLD_GENERATION: str(generation), MMT_ELASTIC_NODES: f"{min_nodes}:{max_nodes}"}


def _with_extra(env: dict[str, str], extra: Optional[Mapping[str, str]]) -> dict[str, str]:
    if extra:
        clash = {k for k in extra if k in env and env[k] != str(extra[k])}
        assert not clash, f"extra variables would change the rank contract: {sorted(clash)}"
        env.update({k: str(v) for k, v in extra.items()})
    return env


def scrubbed(base_env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``base_env`` without inherited cluster, torchelastic, Lightning and rank variables."""
    return {k: v for k, v in base_env.items() if k not in _SCRUB_NAMES and not k.startswith(SCRUBBED_PREFIXES)}


@dataclass(frozen=True)
class RankPlace:
    """Where one process sits in an N x M job (in per-node command mode, local_rank 0 stands for the node)."""

    node_rank: int
    local_rank: int
    num_nodes: int
    local_world_size: int

    @property
    def rank(self) -> int:
        return self.node_rank * self.local_world_size + self.local_rank

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.local_world_size


def threads_per_rank(cores_per_node: int, ranks_per_node: int) -> str:
    return str(max(1, cores_per_node // max(1, ranks_per_node)))


def framework_port_count(framework: str, process_count: int) -> int:
    """Ports a job's framework needs held for it, besides MASTER_PORT: one per TensorFlow worker (TF_CONFIG names
    each worker's own host:port), one for JAX's coordinator."""
    return process_count if framework == TENSORFLOW else 1 if framework == JAX else 0


def host_port(host: str, port: Any) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tf_config(workers: Sequence[str], index: int) -> str:
    """TF_CONFIG of worker ``index`` of a MultiWorkerMirroredStrategy cluster (``workers``: each one's host:port)."""
    return json.dumps(
        {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": index}}, separators=(",", ":")
    )


def _framework_env(
    framework: str, place: RankPlace, per_node: bool, node_addrs: Sequence[str], ports: Sequence[Any]
) -> Dict[str, str]:
    """The variables of ``framework`` for one process: process i of the plan is worker/process i."""
    if framework == FRAMEWORK_NONE:
        return {}
    count = place.num_nodes if per_node else place.world_size
    index = place.node_rank if per_node else place.rank
    wanted = framework_port_count(framework, count)
    assert len(ports) == wanted, f"framework {framework} needs {wanted} ports held for it, got {len(ports)}"
    if framework == TENSORFLOW:
        node_of = (lambda i: i) if per_node else (lambda i: i // place.local_world_size)
        workers = [host_port(node_addrs[node_of(i)], ports[i]) for i in range(count)]
        return {TF_CONFIG: tf_config(workers, index)}
    env = {
        JAX_COORDINATOR_ADDRESS: host_port(node_addrs[0], ports[0]),
        JAX_NUM_PROCESSES: str(count),
        JAX_PROCESS_ID: str(index),
    }
    if not per_node:  # one device per process, as JAX's own SLURM detection does; per node, all of the node's
        env[JAX_LOCAL_DEVICE_IDS] = str(place.local_rank)
    return env


def contract_env(
    place: RankPlace,
    *,
    per_node: bool,
    master_addr: str,
    master_port: Any,
    job_dir: str,
    job_id: str,
    extra: Optional[Mapping[str, str]] = None,
    node_addrs: Sequence[str] = (),
    framework: str = FRAMEWORK_NONE,
    framework_ports: Sequence[Any] = (),
    restart: int = 0,
    max_restarts: int = 0,
) -> Dict[str, str]:
    """The contract variables of one process, and nothing else.

    ``per_node``: the process is a command that creates the node's ranks itself: no RANK/LOCAL_RANK (they would
    tell Lightning the ranks already exist), and the topology in Lightning's names instead.
    ``extra``: launcher-owned additions (:func:`batch_env`, :func:`topology_hints`); they may not change the rest.
    ``node_addrs``: every node's address in node order (empty: ``master_addr`` for every node, as on one host).
    ``framework``/``framework_ports``: the job's framework and the ports held for it (:func:`framework_port_count`).
    ``restart``/``max_restarts``: how many times the job was restarted after a failure, and may be.
    """
    addrs = list(node_addrs) or [master_addr] * place.num_nodes
    assert len(addrs) == place.num_nodes, f"{len(addrs)} node addresses for {place.num_nodes} nodes"
    env = {
        MASTER_ADDR: master_addr,
        MASTER_PORT: str(master_port),
        NODE_RANK: str(place.node_rank),
        GROUP_RANK: str(place.node_rank),
        WORLD_SIZE: str(place.world_size),
        LOCAL_WORLD_SIZE: str(place.local_world_size),
        NUM_NODES: str(place.num_nodes),
        NNODES: str(place.num_nodes),
        MMT_NODE_ADDRS: ",".join(addrs),
        MMT_NODE_ADDR: addrs[place.node_rank],
        MMT_JOB_DIR: job_dir,
        MMT_JOB_ID: job_id,
        MMT_RESTART_COUNT: str(restart),
        MMT_MAX_RESTARTS: str(max_restarts),
    }
    if per_node:
        env.update(topology_hints(place.num_nodes, place.local_world_size))
    else:
        env[LOCAL_RANK] = str(place.local_rank)
        env[RANK] = env[GLOBAL_RANK] = str(place.rank)
    env.update(_framework_env(framework, place, per_node, addrs, framework_ports))
    return _with_extra(env, extra)


def framework_threads(framework: str, omp_threads: str, env: Mapping[str, str]) -> Dict[str, str]:
    """TensorFlow's own thread pools, sized like OpenMP's unless the user sized them: intra-op = OMP_NUM_THREADS,
    inter-op = at most 2 (TF's default of one thread per core in each pool oversubscribes a shared node)."""
    if framework != TENSORFLOW:
        return {}
    intra = int(omp_threads) if omp_threads.isdigit() and int(omp_threads) > 0 else 1
    wanted = {TF_NUM_INTRAOP_THREADS: str(intra), TF_NUM_INTEROP_THREADS: str(min(2, intra))}
    return {name: value for name, value in wanted.items() if name not in env}


# ------------------------------------------------------------------------------------------ who listens where


class PortClaim(NamedTuple):
    """A port mmt holds for one process of a job's framework: only ``owner`` may listen on it."""

    owner: int
    what: str


def process_index(env: Mapping[str, str]) -> Optional[int]:
    """The plan's process index of a process, from its contract (None outside a job)."""
    for name in (JAX_PROCESS_ID, RANK, NODE_RANK):
        if (env.get(name) or "").isdigit():
            return int(env[name])
    return None


def _port_of(address: str) -> Optional[int]:
    tail = address.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def port_claims(env: Mapping[str, str]) -> Dict[int, PortClaim]:
    """The framework ports of a job, read from one of its processes' contract (what mmt wrote, not what a script
    changed later in its own process): port -> the process that may listen on it."""
    claims: Dict[int, PortClaim] = {}
    if env.get(TF_CONFIG):
        workers = json.loads(env[TF_CONFIG]).get("cluster", {}).get("worker", [])
        for index, address in enumerate(workers):
            port = _port_of(address)
            if port is not None:
                claims[port] = PortClaim(index, f"TF worker {index}'s own port in the TF_CONFIG mmt wrote")
    if env.get(JAX_COORDINATOR_ADDRESS):
        port = _port_of(env[JAX_COORDINATOR_ADDRESS])
        if port is not None:
            claims[port] = PortClaim(0, "JAX's coordinator (JAX_COORDINATOR_ADDRESS, process 0)")
    return claims


def misplaced_listener(env: Mapping[str, str], listening: Mapping[int, Collection[int]]) -> Optional[str]:
    """Why a job's framework cannot form, from where its processes listen (``listening``: process index -> the TCP
    ports its processes listen on), or None. ``env``: any process's contract of the job.

    A TensorFlow worker listening on MASTER_PORT runs a TF_CONFIG that is not mmt's but built from
    MASTER_ADDR:MASTER_PORT; a process listening on another one's framework port runs ids that are not mmt's.
    Either way the workers wait for each other until the time limit; this names the cause at once.
    """
    claims = port_claims(env)
    master_port = int(env[MASTER_PORT]) if (env.get(MASTER_PORT) or "").isdigit() else None
    tensorflow = bool(env.get(TF_CONFIG))
    who = "TF worker" if tensorflow else "JAX process"
    for index in sorted(listening):
        for port in sorted(set(listening[index])):
            if tensorflow and port == master_port and port not in claims:
                own = next((p for p, claim in claims.items() if claim.owner == index), None)
                return (
                    f"TF worker {index} listens on MASTER_PORT {port} instead of its own port {own} from the "
                    "TF_CONFIG mmt wrote: the script sets TF_CONFIG itself from MASTER_ADDR:MASTER_PORT (the "
                    "Lightning guide's snippet lists that one address once per worker), so every worker claims "
                    "rank 0's address and they never meet. HINT: delete the script's TF_CONFIG code: with "
                    "hydra.launcher.framework=tensorflow mmt writes each worker's own TF_CONFIG"
                )
            claim = claims.get(port)
            if claim is not None and claim.owner != index:
                return (
                    f"{who} {index} listens on port {port}, which mmt holds for {claim.what}: the script changed "
                    "the framework's addresses or process ids mmt wrote. HINT: leave TF_CONFIG, "
                    "JAX_COORDINATOR_ADDRESS and the process ids as mmt sets them (docs/frameworks.md)"
                )
    return None


# what TensorFlow says when a worker cannot serve at the address its TF_CONFIG gives it
TF_SERVER_FAILED = "Could not start gRPC server"


def self_made_tf_config(env: Mapping[str, str], output: str) -> Optional[str]:
    """Why a process failed, when it ran TensorFlow with a TF_CONFIG it made itself, in a job that did not say it is
    TensorFlow (``env``: its contract, where mmt wrote no TF_CONFIG; ``output``: the end of what it printed), or
    None. Looked for only after a failure: a job that is not TensorFlow pays nothing for it."""
    if env.get(TF_CONFIG) or TF_SERVER_FAILED not in output:
        return None
    return (
        "the command runs TensorFlow with a TF_CONFIG it built itself, and TensorFlow could not start its gRPC "
        "server: every worker was given the same address (the Lightning guide's snippet lists "
        "MASTER_ADDR:MASTER_PORT once per worker), so all but one cannot listen where it is told. HINT: set "
        "hydra.launcher.framework=tensorflow (mmt then writes each worker's own TF_CONFIG, a port held for each) "
        "and delete the script's TF_CONFIG code"
    )


@dataclass(frozen=True)
class RankInfo:
    """What a rank reads back from the contract. Recipes use this, never the raw names."""

    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_dir: Optional[str]
    # the job's batch plan (None outside a job whose recipe states batch.global_size)
    global_batch_size: Optional[int] = None
    micro_batch_size: Optional[int] = None
    grad_accum: Optional[int] = None
    # every node's address in node order (MMT_NODE_ADDRS); () outside a job
    node_addrs: Tuple[str, ...] = ()
    # restarts after a failure so far (the same on every rank), and how many the job may have
    restart_count: int = 0
    max_restarts: int = 0
    # an elastic job's world (docs/elastic.md): its generation, and the node range (None: a fixed node count)
    world_generation: int = 0
    elastic_nodes: Optional[Tuple[int, int]] = None

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that writes results, metrics and checkpoints."""
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "RankInfo":
        """Read the contract; outside an mmt job this is a single process world (1 node x 1 process)."""
        env = os.environ if environ is None else environ

        def number(name: str, default: Any) -> Any:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a whole number: the rank environment is corrupt") from None

        local_world_size = number(LOCAL_WORLD_SIZE, 1)
        world_size = number(WORLD_SIZE, local_world_size)
        return cls(
            rank=number(RANK, 0),
            local_rank=number(LOCAL_RANK, 0),
            node_rank=number(NODE_RANK, number(GROUP_RANK, 0)),
            world_size=world_size,
            local_world_size=local_world_size,
            num_nodes=number(NUM_NODES, max(1, world_size // max(1, local_world_size))),
            master_addr=env.get(MASTER_ADDR, "127.0.0.1"),
            master_port=number(MASTER_PORT, 29500),
            job_dir=env.get(MMT_JOB_DIR),
            global_batch_size=number(MMT_GLOBAL_BATCH_SIZE, None),
            micro_batch_size=number(MMT_MICRO_BATCH_SIZE, None),
            grad_accum=number(MMT_GRAD_ACCUM, None),
            node_addrs=tuple(a for a in env.get(MMT_NODE_ADDRS, "").split(",") if a),
            restart_count=number(MMT_RESTART_COUNT, 0),
            max_restarts=number(MMT_MAX_RESTARTS, 0),
            world_generation=number(MMT_WORLD_GENERATION, 0),
            elastic_nodes=_node_range(env.get(MMT_ELASTIC_NODES)),
        )

    def batch_sizes(
        self, micro: Optional[int] = None, accumulate: Optional[int] = None, default_micro: int = 16
    ) -> Tuple[int, int]:
        """(micro-batch, accumulation) for this rank: explicit values, else the launcher's batch plan, else
        (``default_micro``, 1) outside a planned job.

        An explicit value that contradicts the plan is refused: the plan is what the dry run showed.
        """
        if self.micro_batch_size is None:
            return (micro or default_micro, accumulate or 1)
        planned = (self.micro_batch_size, self.grad_accum or 1)
        chosen = (micro or planned[0], accumulate or planned[1])
        if chosen != planned:
            raise ValueError(
                f"the recipe was given micro-batch {chosen[0]} x accumulation {chosen[1]} but the launcher planned "
                f"{planned[0]} x {planned[1]} for global batch {self.global_batch_size} on {self.world_size} ranks. "
                "HINT: change batch.global_size or batch.micro instead of the recipe's batch_size"
            )
        return chosen

    def check_world_size(self, actual: int, who: str = "trainer") -> None:
        """Refuse to train when a framework computed another world than the launcher created.

        Lightning's LightningEnvironment ignores WORLD_SIZE and derives the world from Trainer(num_nodes, devices);
        a mismatch makes node 0 silently train a smaller world and exit 0.
        """
        if actual != self.world_size:
            raise RuntimeError(
                f"{who}.world_size={actual} but the launcher started WORLD_SIZE={self.world_size} ranks "
                f"({self.num_nodes} nodes x {self.local_world_size}). HINT: pass num_nodes={self.num_nodes} and "
                f"devices={self.local_world_size} to the Trainer/Fabric (RankInfo.from_env() has both)."
            )
