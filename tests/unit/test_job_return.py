"""The primary's JobReturn on disk (mmt.records.job_return): the value without the configs, the configs on use."""

import io
import threading

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from mmt.records import job_return


def _ret(value) -> JobReturn:
    return JobReturn(
        overrides=["+x=3"],
        cfg=OmegaConf.create({"x": 3}),
        hydra_cfg=OmegaConf.create({"hydra": {"job": {"name": "app", "num": 3}}}),
        working_dir="/tmp/job",
        task_name="app",
        status=JobStatus.COMPLETED,
        _return_value=value,
    )


def test_the_value_reads_without_the_configs_and_the_configs_on_first_use():
    ret = _ret({"loss": 0.5})
    read = job_return.load(io.BytesIO(job_return.dumps(ret)))
    assert isinstance(read, JobReturn)
    assert read.return_value == {"loss": 0.5} and read.status == JobStatus.COMPLETED
    assert read.overrides == ["+x=3"] and read.working_dir == "/tmp/job" and read.task_name == "app"
    assert read._configs is not None  # not unpickled yet
    assert read.hydra_cfg.hydra.job.num == 3 and read.cfg == OmegaConf.create({"x": 3})
    assert read._configs is None
    read.cfg = OmegaConf.create({"x": 4})  # a setter, as on any JobReturn
    assert read.cfg.x == 4 and read.hydra_cfg.hydra.job.name == "app"
    # the caller's JobReturn is left whole
    assert ret.cfg.x == 3 and ret.hydra_cfg.hydra.job.num == 3


def test_a_file_of_one_pickle_reads_as_it_was_written():
    ret = _ret(7)
    read = job_return.load(io.BytesIO(cloudpickle.dumps(ret)))
    assert type(read) is JobReturn and read.return_value == 7 and read.cfg.x == 3


def test_an_unpicklable_value_travels_as_its_text():
    ret = _ret(threading.Lock())
    read = job_return.load(io.BytesIO(job_return.dumps(ret)))
    assert read.return_value.startswith("<unpicklable lock: ") and read.cfg.x == 3
