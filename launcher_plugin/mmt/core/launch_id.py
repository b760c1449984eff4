"""The id of the current launch, shared by the Hydra plugin (the default sweep dir ``${mmt_launch_id:}``) and the
engine (the default job names and ids): its start time and a random token, so two sweeps started in the same second
never share a dir (``${now:%H-%M-%S}`` alone collides).

A new id is made for every run of a Hydra app: Hydra executes the plugin's config module again at each plugin scan,
and that module calls :func:`renew` (an app that runs several times in one process, as Hydra's own test suites
do, gets a new id each time, and so new job names)."""

import secrets
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchId:
    #: the default sweep dir's last part: ``HH-MM-SS-<token>``
    launch: str
    #: the default job names' and ids' part: ``mmdd-HHMMSS-<token>``
    job_names: str


def _new() -> LaunchId:
    started, token = time.localtime(), secrets.token_hex(2)
    return LaunchId(
        launch=time.strftime("%H-%M-%S", started) + "-" + token,
        job_names=time.strftime("%m%d-%H%M%S", started) + "-" + token,
    )


_current = _new()


def current() -> LaunchId:
    return _current


def adopt(given: LaunchId) -> None:
    """This process plans no launch of its own: it runs one another process planned (the cluster's side of a launch
    over SSH), whose job names and ids it keeps."""
    global _current
    _current = given


def renew() -> LaunchId:
    global _current
    _current = _new()
    return _current
