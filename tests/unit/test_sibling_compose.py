"""Issue 39: a sweep job's config derived from a sibling's (``mmt.launching.sibling_compose``) is Hydra's own result.

Every job of each sweep below is composed twice: by Hydra's config loader as Hydra's basic launcher composes it
(``ConfigLoaderImpl.load_sweep_config``), and through mmt's wrapper of another loader of the same app. The two
configs must be the same, hydra section included (overrides, override_dirname, choices), with the same flags; a
job Hydra refuses is refused the same way. Each sweep also says how many of its jobs Hydra itself composed through
mmt's wrapper: a sweep of plain values composes one job per shape, anything else composes every job.
"""

from pathlib import Path
from typing import Any, List, Sequence, Tuple

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf

from mmt.launching.compose_once import ComposeOnce, compose_job, forget

APP = """\
defaults:
  - db: mysql
  - _self_
x: 1
s: hello
f: 0.5
flag: true
maybe: null
seed: 0
nested:
  a: 1
  b: ${x}
d:
  k: 1
lst: [1, 2]
hydra:
  job:
    config:
      override_dirname:
        exclude_keys: [seed]
"""


def _loader(conf: Path) -> ConfigLoaderImpl:
    return ConfigLoaderImpl(config_search_path=create_config_search_path(str(conf)))


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    (conf / "db").mkdir(parents=True)
    (conf / "config.yaml").write_text(APP)
    (conf / "db" / "mysql.yaml").write_text("host: mysql.local\nport: 3306\n")
    (conf / "db" / "postgres.yaml").write_text("host: pg.local\nport: 5432\nuser: ${s}\n")
    return conf


def _master(loader: ConfigLoaderImpl, tmp_path: Path) -> Any:
    return loader.load_configuration(
        config_name="config", overrides=[f"hydra.sweep.dir={tmp_path / 'sweep'}"], run_mode=RunMode.MULTIRUN
    )


def _flags(config: Any) -> Tuple[Any, ...]:
    return (
        OmegaConf.is_struct(config),
        OmegaConf.is_readonly(config),
        OmegaConf.is_readonly(config.hydra),
        OmegaConf.is_struct(config.hydra),
    )


def _both(conf: Path, tmp_path: Path, sweep: Sequence[Sequence[str]]) -> Tuple[List[Any], List[Any], int]:
    """Each job's config from Hydra, and through mmt (checked as the sweeper checks a batch, then taken as the
    launcher takes it), and how many Hydra composed for mmt."""
    hydra_loader, mmt_loader = _loader(conf), _loader(conf)
    hydra_master, mmt_master = _master(hydra_loader, tmp_path), _master(mmt_loader, tmp_path)
    composed = []
    original = mmt_loader.load_sweep_config

    def counted(master: Any, overrides: List[str]) -> Any:
        composed.append(tuple(overrides))
        return original(master, overrides)

    mmt_loader.load_sweep_config = counted  # type: ignore[method-assign]
    ComposeOnce.install(mmt_loader)
    theirs, ours = [], []
    for overrides in sweep:
        for loader, master, out in ((hydra_loader, hydra_master, theirs), (mmt_loader, mmt_master, ours)):
            try:
                out.append(loader.load_sweep_config(master, list(overrides)))
            except ConfigCompositionException as exc:
                out.append(("refused", str(exc)))
    taken = [
        compose_job(mmt_loader, mmt_master, list(overrides)) if not isinstance(mine, tuple) else mine
        for overrides, mine in zip(sweep, ours)
    ]
    assert all(a is b for a, b in zip(taken, ours))  # the launcher takes what the check composed
    return theirs, ours, len(composed)


def _same(theirs: List[Any], ours: List[Any]) -> None:
    for hydra_config, mmt_config in zip(theirs, ours):
        if isinstance(hydra_config, tuple):
            assert mmt_config == hydra_config
            continue
        assert OmegaConf.to_yaml(mmt_config) == OmegaConf.to_yaml(hydra_config)
        app = {k: v for k, v in mmt_config.items() if k != "hydra"}
        assert OmegaConf.to_container(OmegaConf.create(app), resolve=True) == OmegaConf.to_container(
            OmegaConf.create({k: v for k, v in hydra_config.items() if k != "hydra"}), resolve=True
        )
        assert _flags(mmt_config) == _flags(hydra_config)


@pytest.mark.parametrize(
    "sweep, hydra_composes",
    [
        ([["x=1"], ["x=2"], ["x=3"]], 1),
        ([["+y=a"], ["+y='b b'"], ["+y=null"], ["+y=3"]], 1),
        ([["++x=5"], ["++x=text"]], 1),
        ([["nested.a=7"], ["nested.a=null"], ["nested.a=true"], ["nested.a=1.5"], ["nested.a=${x}"]], 1),
        ([["s=hi", "x=1"], ["s=hi", "x=2"], ["s=there", "x=2"]], 1),
        ([["db=mysql", "x=1"], ["db=mysql", "x=2"], ["db=postgres", "x=1"], ["db=postgres", "x=2"]], 2),
        ([["db.port=1"], ["db.port=2"]], 1),
        ([["seed=1", "x=1"], ["seed=2", "x=1"], ["seed=3", "x=4"]], 1),  # seed is left out of override_dirname
        ([["d={k:2}"], ["d={j:3}"]], 2),  # a dict merges into the node: composed by Hydra
        ([["lst=[3]"], ["lst=[4,5]"]], 2),
        ([["hydra.job.chdir=true"], ["hydra.job.chdir=false"]], 2),
        ([["~maybe"], ["~maybe"]], 2),
        ([["x=1", "x=2"], ["x=3", "x=2"]], 2),  # a key given twice: the last one wins, in Hydra's order
        ([["x=1", "s=a"], ["s=a", "x=2"]], 2),  # another order is another shape
        ([["+x=1"], ["+x=2"]], 2),  # refused by Hydra (x is there already), each time in its words
        ([["nope=1"], ["nope=2"]], 2),  # refused: no such key
        ([["x=1"], ["x=[1,2]"], ["x=3"]], 2),  # a list among plain values is composed; the plain ones derive
    ],
)
def test_every_job_is_the_config_hydra_composes(conf, tmp_path, sweep, hydra_composes):
    theirs, ours, composed = _both(conf, tmp_path, sweep)
    _same(theirs, ours)
    assert composed == hydra_composes


def test_a_derived_config_is_its_own(conf, tmp_path):
    """The launcher changes the config it takes (the job's id and dir): a sibling derived later never sees that."""
    _, ours, _ = _both(conf, tmp_path, [["x=1"], ["x=2"]])
    OmegaConf.set_readonly(ours[0].hydra, False)
    ours[0].hydra.job.num = 7
    ours[0].nested.a = 99
    loader = _loader(conf)
    master = _master(loader, tmp_path)
    ComposeOnce.install(loader)
    first = compose_job(loader, master, ["x=1"])
    first.nested.a = 99
    second = compose_job(loader, master, ["x=2"])
    assert second.nested.a == 1 and second.x == 2 and second.nested.b == 2


def test_another_master_config_is_another_sweep(conf, tmp_path):
    loader = _loader(conf)
    ComposeOnce.install(loader)
    one = compose_job(loader, _master(loader, tmp_path), ["x=1"])
    other_master = loader.load_configuration(
        config_name="config", overrides=[f"hydra.sweep.dir={tmp_path / 'other'}"], run_mode=RunMode.MULTIRUN
    )
    two = compose_job(loader, other_master, ["x=2"])
    assert one.hydra.sweep.dir.endswith("sweep") and two.hydra.sweep.dir.endswith("other")


def test_batches_of_one_compose_two_jobs_and_derive_the_rest(conf, tmp_path):
    """A sweeper that checks and launches one job at a time (Optuna's batches of one): the launcher takes each
    config before the next job is asked for, so Hydra composes the first two and the rest derive from a copy."""
    hydra_loader, loader = _loader(conf), _loader(conf)
    hydra_master, master = _master(hydra_loader, tmp_path), _master(loader, tmp_path)
    composed = []
    original = loader.load_sweep_config
    loader.load_sweep_config = lambda m, o: composed.append(o) or original(m, o)  # type: ignore[method-assign]
    ComposeOnce.install(loader)
    for x in range(6):
        checked = loader.load_sweep_config(master, [f"x={x}"])
        taken = compose_job(loader, master, [f"x={x}"])
        assert taken is checked
        OmegaConf.set_readonly(taken.hydra, False)
        taken.hydra.job.num = x  # what the launcher does to the config it takes
        forget(loader)
        expected = hydra_loader.load_sweep_config(hydra_master, [f"x={x}"])
        expected.hydra.job.num = x
        assert OmegaConf.to_yaml(taken) == OmegaConf.to_yaml(expected)
    assert len(composed) == 2


def test_a_single_job_is_never_copied(conf, tmp_path, monkeypatch):
    """A launch of one job pays nothing for its siblings: its config is kept, not copied, and dropped when taken."""
    import copy
    from types import SimpleNamespace

    import mmt.launching.sibling_compose as sibling

    copies = []
    counting = SimpleNamespace(deepcopy=lambda value, *a: copies.append(value) or copy.deepcopy(value, *a))
    monkeypatch.setattr(sibling, "copy", counting)  # the module's copies only, not Hydra's own
    loader = _loader(conf)
    master = _master(loader, tmp_path)
    ComposeOnce.install(loader)
    loader.load_sweep_config(master, ["x=1"])
    compose_job(loader, master, ["x=1"])
    forget(loader)
    assert copies == []
    loader.load_sweep_config(master, ["x=2"])  # a second job of its shape: a copy, kept for the rest
    assert len(copies) == 1
