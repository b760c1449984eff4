"""The id of this launcher process, shared by the Hydra plugin (the default sweep dir ``${mmt_launch_id:}``) and
the engine (the default job names and ids): unique per process, so two sweeps started in the same second never
share a dir (``${now:%H-%M-%S}`` alone collides)."""

import secrets
import time

_STARTED, _TOKEN = time.localtime(), secrets.token_hex(2)
LAUNCH_ID = time.strftime("%H-%M-%S", _STARTED) + "-" + _TOKEN
JOB_NAME_ID = time.strftime("%m%d-%H%M%S", _STARTED) + "-" + _TOKEN
