"""A cross-process psum with JAX: every process contributes process_id + 1, every process checks the sum.

mmt writes JAX_COORDINATOR_ADDRESS (process 0's host and a port held for the coordinator), JAX_NUM_PROCESSES
and JAX_PROCESS_ID; jax.distributed.initialize reads the first by itself and takes the other two as arguments:

    python train.py -m command='python examples/frameworks/jax_psum.py' command_mode=per_rank \\
        num_nodes=2 devices=2 hydra.launcher.framework=jax

(per_node works too: one JAX process per node, with all of the node's devices.) See docs/frameworks.md.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# the one call: the coordinator's address comes from JAX_COORDINATOR_ADDRESS
jax.distributed.initialize(
    num_processes=int(os.environ["JAX_NUM_PROCESSES"]), process_id=int(os.environ["JAX_PROCESS_ID"])
)

mesh = Mesh(np.array(jax.devices()), ("p",))
mine = np.full((jax.local_device_count(),), jax.process_index() + 1.0, dtype=np.float32)
values = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("p")), mine)
total = jax.jit(
    jax.shard_map(lambda v: jax.lax.psum(v, "p"), mesh=mesh, in_specs=PartitionSpec("p"), out_specs=PartitionSpec())
)(values)
got = float(jnp.asarray(total.addressable_data(0)).reshape(-1)[0])
n = jax.process_count()
expected = float(jax.local_device_count() * n * (n + 1) / 2)
print(
    f"process {jax.process_index()} of {n}: psum {got} expected {expected} "
    f"devices {jax.device_count()} ok={got == expected}",
    flush=True,
)
jax.distributed.shutdown()
assert got == expected, (got, expected)
