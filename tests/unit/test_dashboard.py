"""``mmt dashboard`` without a server process: reading job dirs (mmt.dashboard.data), the JSON API through a test
client, its refusals (loopback only, nothing outside the job dirs), the page's own files, and the browser helper's
verdict without selenium. (The served command and the live page in Chromium: tests/e2e/test_dashboard.py.)"""

import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Dict

import pytest

from helpers import browser
from helpers.browser import chromium
from helpers.dashboard import (
    FAILURE,
    SECRET,
    TestClient,
    client_for,
    job_id,
    make_job,
    make_outputs,
    result_record,
    sample,
)
from mmt.dashboard import data, server
from mmt.dashboard.app import STATIC_DIR


@pytest.fixture
def outputs(tmp_path) -> Path:
    """outputs/multirun/<date>/<time>/<job>: a finished sweep of three jobs (one failed) and a running job."""
    return make_outputs(tmp_path)


# ------------------------------------------------------------------------------------------------- data.py


def test_discovery_finds_job_dirs_under_a_parent_a_sweep_or_a_job_and_groups_them_by_sweep(outputs, tmp_path):
    sweep = outputs / "multirun" / "2026-12-02" / "10-47-40"
    found = data.discover([outputs])
    assert [p.relative_to(outputs.resolve()).as_posix() for p in found] == [
        "multirun/2026-12-02/10-47-40/0",
        "multirun/2026-12-02/10-47-40/1",
        "multirun/2026-12-02/10-47-40/2",
        "multirun/2026-12-02/11-00-00/0",
    ]
    assert data.discover([sweep]) == found[:3]
    assert data.discover([sweep / "1"]) == [found[1]]
    # too deep, hidden (.submitit), or behind a symlinked dir: not searched
    make_job(outputs / "a" / "b" / "c" / "d" / "e" / "0", result=result_record(0))
    make_job(sweep / ".submitit" / "0", result=result_record(0))
    elsewhere = make_job(tmp_path / "elsewhere" / "0", result=result_record(0))
    (outputs / "link").symlink_to(elsewhere.parent)
    assert data.discover([outputs]) == found
    # the registry's job dirs come in as they are
    assert data.discover([outputs], [elsewhere]) == sorted(found + [elsewhere.resolve()], key=data._job_order)

    groups = data.sweeps({data.opaque_id(p): p for p in found})
    assert [(g["path"], [j["num"] for j in g["jobs"]]) for g in groups] == [
        (str(sweep.resolve()), ["0", "1", "2"]),
        (str(found[3].parent), ["0"]),
    ]
    assert groups[0]["counts"] == {"COMPLETED": 2, "FAILED": 1}


def test_status_topology_and_metric_of_running_and_finished_jobs(outputs, tmp_path):
    sweep = outputs / "multirun" / "2026-12-02" / "10-47-40"
    done = data.job_summary("x", sweep.resolve() / "0")
    assert (done["status"], done["num_nodes"], done["devices"], done["machine"]) == ("COMPLETED", 2, 2, "cpu")
    assert (done["duration_s"], done["metric_name"], done["metric"]) == (12.5, "val_loss", 6.0)
    assert done["overrides"] == ["recipe.lr=0.1", "num_nodes=2"]

    running = data.job_summary("x", (outputs / "multirun" / "2026-12-02" / "11-00-00" / "0").resolve())
    # topology of a running job: its composed config and its log names (devices=null: from the 4 rank logs)
    assert (running["status"], running["num_nodes"], running["devices"], running["machine"]) == ("RUNNING", 2, 2, "cpu")
    assert 4 <= running["duration_s"] < 60 and running["metric"] is None and running["name"] == "train-run"
    assert running["overrides"] == ["num_nodes=2"]

    # a result of an older attempt under a live owner: running again (a requeued job); same attempt: finished
    job = make_job(
        tmp_path / "s" / "0", result=result_record(0, attempt="old"), owner={"attempt": "new", "started": time.time()}
    )
    assert data.job_summary("x", job)["status"] == "RUNNING"
    (job / ".mmt" / "owner.json").write_text(json.dumps({"attempt": "old"}))
    assert data.job_summary("x", job)["status"] == "COMPLETED"
    never_started = make_job(tmp_path / "s" / "1", logs={"node0.log": ""})
    assert data.job_summary("x", never_started)["status"] == "PENDING"
    # topology from the log names alone; a per-node command's log says nothing about devices
    only_logs = make_job(
        tmp_path / "s" / "2",
        owner={"attempt": "a"},
        logs={"node0.rank0.log": "", "node0.rank1.log": "", "node0.rank2.log": ""},
    )
    assert data.job_summary("x", only_logs)[("num_nodes")] == 1
    assert data.job_summary("x", only_logs)["devices"] == 3
    # metric: a number returned, a result from before summary_metric was recorded, a non-finite value
    # (a bare number is named as the console summary and summary.png name it: mmt.records.metric)
    assert data.metric({"return_value": 0.5, "summary_metric": None}) == ("result", 0.5)
    assert data.metric({"return_value": {"val_loss": 2.0}}) == ("val_loss", 2.0)
    assert data.metric({"return_value": {"acc": "nan"}, "summary_metric": "acc"}) == ("acc", None)
    # NaN written by another tool: read (Python's json allows it), sent as null (JSON does not)
    (job / "result.json").write_text(
        '{"status": "COMPLETED", "attempt": "old", "duration_s": NaN, "return_value": {"loss": NaN}}'
    )
    assert data.job_detail("x", job)["return_value"] == {"loss": None}
    assert data.job_summary("x", job)["duration_s"] is None


def test_node_metrics_ignore_a_partial_last_line_and_draw_no_gpus_where_none_are_reported(tmp_path):
    lines = "".join(sample(1000.0 + i) for i in range(5)) + "not json\n" + '{"t": 1010.0, "cpu_perc'
    job = make_job(tmp_path / "0", metrics={0: lines})
    [node] = data.node_metrics(job)
    assert node["node"] == 0 and node["host"] == "box"
    assert node["t"] == [1000.0 + i for i in range(5)]
    assert node["series"]["job_cpu_percent"] == [180.0] * 5
    assert node["gpus"] == []  # a CPU node: no GPU series at all, not zeros

    gpu = {
        "index": 0,
        "name": "NVIDIA H100",
        "util_percent": 97.0,
        "mem_used_bytes": 70 << 30,
        "mem_total_bytes": 80 << 30,
        "power_w": 650.5,
        "temp_c": 71.0,
    }
    (job / "metrics" / "node1.jsonl").write_text(
        sample(1000.0, 1, [gpu, {**gpu, "index": 1, "util_percent": 12.0}])
        + sample(1001.0, 1, [gpu])
        + sample(1002.0, 1, [{**gpu, "power_w": float("nan")}])
    )
    _, node1 = data.node_metrics(job)
    assert [g["index"] for g in node1["gpus"]] == [0, 1]
    assert node1["gpus"][0]["series"]["util_percent"] == [97.0, 97.0, 97.0]
    assert node1["gpus"][0]["series"]["power_w"] == [650.5, 650.5, None]  # NaN: no point, not a crash
    assert node1["gpus"][1]["series"]["util_percent"] == [12.0, None, None]

    # since: only what is newer; the cap thins evenly and keeps the newest sample
    assert data.node_metrics(job, since=1003.0)[0]["t"] == [1004.0]
    (job / "metrics" / "node0.jsonl").write_text("".join(sample(float(i)) for i in range(5000)))
    thinned = data.node_metrics(job, limit=100)[0]["t"]
    assert len(thinned) == 100 and thinned[0] == 0.0 and thinned[-1] == 4999.0


def test_training_curves_from_lightning_and_mmt_csv(tmp_path):
    lightning = "epoch,step,train_loss,val_loss\n0,0,9.2,\n0,1,9.0,\n0,1,,8.5\n0,2,8.7,\n0,3,8.4"
    curves = data.training_curves(make_job(tmp_path / "0", csv=lightning))
    # the row still being written (no newline) is left out; a step's train and val rows are merged
    assert curves == {
        "step": [0.0, 1.0, 2.0],
        "series": {"train_loss": [9.2, 9.0, 8.7], "val_loss": [None, 8.5, None]},
        "restarts": [],
    }
    own = data.training_curves(make_job(tmp_path / "1", csv="step,train_loss,val_loss\n0,2.0,\n1,1.5,1.7\n"))
    assert own == {"step": [0.0, 1.0], "series": {"train_loss": [2.0, 1.5], "val_loss": [None, 1.7]}, "restarts": []}
    assert data.training_curves(tmp_path / "2") == {"step": [], "series": {}, "restarts": []}
    # a restarted run resumed at step 1 from its checkpoint: a mark there, and its rows win
    restarted = "epoch,step,train_loss,val_loss\n0,0,9.2,\n0,1,9.0,\n0,2,8.7,\n0,1,8.9,\n0,2,8.6,\n0,3,8.3,\n"
    curves = data.training_curves(make_job(tmp_path / "3", csv=restarted))
    assert curves["restarts"] == [1.0] and curves["series"]["train_loss"] == [9.2, 8.9, 8.6, 8.3]


def test_log_ranges_tail_then_follow_from_an_offset(tmp_path):
    log = tmp_path / "node0.rank0.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(10000)))
    size = log.stat().st_size
    tail = data.read_log(log, None, tail=1000)
    assert tail["reset"] and tail["next"] == size and tail["offset"] > size - 1000
    assert tail["text"].startswith("line ") and tail["text"].endswith("line 9999\n")  # whole lines only
    assert data.read_log(log, size)["text"] == ""
    with log.open("ab") as handle:
        handle.write(b"new \xff line\nhalf a li")
    grown = data.read_log(log, size)
    assert grown["text"] == "new \ufffd line\n" and grown["next"] == size + 11  # the half line waits
    assert data.read_log(log, grown["next"])["text"] == ""
    assert data.read_log(log, grown["next"], whole_lines=False)["text"] == "half a li"  # a finished job's end
    # a big backlog comes in chunks; a truncated file starts over from its tail
    first = data.read_log(log, 0, limit=4096)
    assert len(first["text"]) <= 4096 and first["more"] and first["text"].endswith("\n")
    log.write_bytes(b"restarted\n")
    assert data.read_log(log, size)["reset"] and data.read_log(log, size)["text"] == "restarted\n"


def test_swept_parameters_are_those_whose_overrides_differ():
    jobs = [
        {"id": str(i), "num": str(i), "status": "COMPLETED", "metric_name": "val_loss", "metric": m, "overrides": o}
        for i, (m, o) in enumerate(
            [
                (6.0, ["recipe.lr=0.1", "+opt=adam", "num_nodes=2"]),
                (5.0, ["recipe.lr=1.0", "+opt=sgd", "num_nodes=2"]),
                (None, ["recipe.lr=0.01", "+opt=adam", "num_nodes=2"]),
            ]
        )
    ]
    swept = data.swept_parameters(jobs)
    assert swept["metric_name"] == "val_loss"
    assert [p["name"] for p in swept["params"]] == ["recipe.lr", "opt"]  # num_nodes is the same everywhere
    lr, opt = swept["params"]
    assert lr["numeric"]
    assert [(p["x"], p["metric"]) for p in lr["points"]] == [(0.01, None), (0.1, 6.0), (1.0, 5.0)]
    assert opt["categories"] == ["adam", "sgd"] and [p["x"] for p in opt["points"]] == [0, 0, 1]


# ------------------------------------------------------------------------------------------------------ API


def test_api_lists_jobs_and_serves_a_job_its_failure_metrics_curves_and_logs(outputs):
    sweep = (outputs / "multirun" / "2026-12-02" / "10-47-40").resolve()
    failed = sweep / "2"
    (failed / "logs" / "node0.rank1.log").write_text("".join(f"rank 1 line {i}\n" for i in range(100)))
    (failed / "metrics").mkdir()
    (failed / "metrics" / "node0.jsonl").write_text(sample(1.0) + sample(2.0) + sample(3.0))
    (failed / "metrics.csv").write_text("step,train_loss\n0,2.0\n1,1.0\n")
    client = client_for(outputs)

    listed = client.get("/api/jobs").json()["sweeps"]
    statuses = [[j["status"] for j in s["jobs"]] for s in listed]
    assert statuses == [["COMPLETED", "COMPLETED", "FAILED"], ["RUNNING"]]
    assert "path" not in listed[0]["jobs"][0]  # the list names jobs by id only

    job = client.get(f"/api/jobs/{job_id(failed)}").json()
    assert job["status"] == "FAILED"
    assert job["failure"]["exception"] == "ProbeFault: injected failure on rank 1"
    assert "recipes.probe.ProbeFault: injected failure on rank 1" in job["failure"]["traceback"]
    assert [log["name"] for log in job["logs"]] == ["node0.rank0.log", "node0.rank1.log"]
    assert job["metric_nodes"] == [0] and job["curves_version"]

    nodes = client.get(f"/api/jobs/{job_id(failed)}/metrics", params={"since": "1.5"}).json()["nodes"]
    assert nodes[0]["t"] == [2.0, 3.0]
    assert client.get(f"/api/jobs/{job_id(failed)}/curves").json()["series"] == {"train_loss": [2.0, 1.0]}

    url = f"/api/jobs/{job_id(failed)}/log"
    tail = client.get(url, params={"name": "node0.rank1.log"}).json()
    assert tail["text"].endswith("rank 1 line 99\n")
    with (failed / "logs" / "node0.rank1.log").open("a") as handle:
        handle.write("one more\n")
    grown = client.get(url, params={"name": "node0.rank1.log", "offset": tail["next"]}).json()
    assert grown["text"] == "one more\n"

    swept = client.get(f"/api/sweeps/{data.opaque_id(sweep)}").json()
    assert [p["name"] for p in swept["params"]] == ["recipe.lr"]
    points = swept["params"][0]["points"]
    assert [(p["x"], p["metric"]) for p in points] == [(0.1, 6.0), (1.0, 5.0), (10.0, None)]

    page = client.get("/")
    assert page.status_code == 200 and "static/app.js" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/static/vendor/uPlot.iife.min.js").status_code == 200


def test_api_serves_nothing_outside_the_job_dirs(outputs, tmp_path):
    secret = tmp_path / "passwd"
    secret.write_text(SECRET + "\n")
    job = (outputs / "multirun" / "2026-12-02" / "10-47-40" / "0").resolve()
    (job / "logs" / "node0.rank1.log").symlink_to(secret)  # a log that points out of the job dir
    (job / "logs" / "node0.rank2.log").symlink_to("/etc/passwd")
    (job / "metrics").mkdir()
    (job / "metrics" / "node0.jsonl").symlink_to(secret)
    linked = make_job(tmp_path / "s" / "0", result=result_record(0))
    (linked / "logs").symlink_to(tmp_path)  # a logs dir that points out: every "log" in it would be outside
    (tmp_path / "node0.rank0.log").write_text(SECRET + "\n")
    client = client_for(outputs, tmp_path / "s")

    leaked = []

    def get(url, **params):
        response = client.get(url, params=params)
        if SECRET in response.text or "root:x:0:0" in response.text:
            leaked.append(url)
        return response.status_code

    log = f"/api/jobs/{job_id(job)}/log"
    listed = client.get(f"/api/jobs/{job_id(job)}").json()["logs"]
    assert [name["name"] for name in listed] == ["node0.rank0.log"]
    assert client.get(f"/api/jobs/{job_id(linked)}").json()["logs"] == []
    for name in (
        "../result.json",
        "..%2fresult.json",
        "%2e%2e/result.json",
        "/etc/passwd",
        "node0.rank0.log/..",
        "../../../../etc/passwd",
        "node0.rank0.log\x00.txt",
    ):
        assert get(log, name=name) == 400, name
    for name in ("node0.rank1.log", "node0.rank2.log", "node0.rank7.log"):
        assert get(log, name=name) == 404, name
    assert get(f"/api/jobs/{job_id(linked)}/log", name="node0.rank0.log") == 404
    assert client.get(f"/api/jobs/{job_id(job)}/metrics").json() == {"nodes": []}
    assert get(log, name="node0.rank0.log", offset="-5") == 400
    assert get(log, name="node0.rank0.log", offset="x") == 400
    assert get(f"/api/jobs/{job_id(job)}/metrics", since="nan") == 400
    # jobs by id from the app's own list only: never a path, never a dir it was not given
    for bad in (
        "0000000000000000",
        data.opaque_id(tmp_path.resolve()),
        data.opaque_id(Path("/etc")),
        "..",
        "%2e%2e",
        "%2Fetc%2Fpasswd",
        str(job),
    ):
        assert get(f"/api/jobs/{bad}") == 404, bad
        assert get(f"/api/jobs/{bad}/log", name="node0.rank0.log") == 404, bad
    assert get(f"/api/sweeps/{data.opaque_id(tmp_path.resolve())}") == 404
    # static files: the package's static dir only
    for path in (
        "/static/../data.py",
        "/static/%2e%2e/data.py",
        "/static/..%2fdata.py",
        "/static/%2e%2e%2fapp.py",
        "/static//etc/passwd",
        "/static/%2Fetc%2Fpasswd",
        "/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
    ):
        status = get(path)
        assert status in (400, 404), (path, status)
    assert client.get("/static/%2e%2e/data.py").text.find("def discover") < 0
    assert not leaked, leaked
    # a page on another site whose name rebinds to 127.0.0.1 is not served
    assert client.get("/api/jobs", headers={"host": "evil.example"}).status_code == 400


MARKER = "read-from-outside-the-job-dirs"


def _link(link: Path, target: Path, relative: bool = False) -> None:
    """``link`` -> ``target``, absolute or as a ``../../..`` path from the link's dir."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent) if relative else target)


def _served_texts(client: TestClient, sweep: Path) -> Dict[str, str]:
    """Every answer the API gives about the jobs in ``sweep``: list, job, metrics, curves, logs, sweep."""
    answers = {"/api/jobs": client.get("/api/jobs").text}
    for job in sorted(sweep.iterdir()):
        base = f"/api/jobs/{job_id(job)}"
        detail = client.get(base)
        assert detail.status_code == 200, (job, detail.text)
        answers[base] = detail.text
        for part in ("metrics", "curves"):
            answers[f"{base}/{part}"] = client.get(f"{base}/{part}").text
        for log in detail.json()["logs"]:
            params = {"name": log["name"]}
            answers[f"{base}/log {log['name']}"] = client.get(f"{base}/log", params=params).text
    sweep_url = f"/api/sweeps/{data.opaque_id(sweep.resolve())}"
    answers[sweep_url] = client.get(sweep_url).text
    return answers


def test_symlinks_in_a_job_dir_never_serve_their_targets(tmp_path):
    # readable files outside the job dirs, each of which would put MARKER in an answer if it were read
    outside = tmp_path / "outside"
    leaked_result = result_record(
        0, overrides=[f"leak={MARKER}"], name=MARKER, error=MARKER, failure={**FAILURE, "traceback": MARKER}
    )
    make_job(
        outside,
        result=leaked_result,
        owner={"attempt": "x", "name": MARKER, "backend": MARKER, "started": time.time()},
        metrics={0: sample(1.0, host=MARKER) + sample(2.0, host=MARKER)},
        csv=f"step,{MARKER}_loss\n0,1.5\n1,1.25\n",
        config={"num_nodes": 7, "devices": 3, "machine": {"name": MARKER, "gpus": 0}},
        overrides=[f"leak={MARKER}"],
    )
    files = {
        "result.json": outside / "result.json",
        "metrics.csv": outside / "metrics.csv",
        "metrics/node0.jsonl": outside / "metrics" / "node0.jsonl",
        ".hydra/config.yaml": outside / ".hydra" / "config.yaml",
        ".hydra/overrides.yaml": outside / ".hydra" / "overrides.yaml",
        ".mmt/owner.json": outside / ".mmt" / "owner.json",
    }
    sweep = tmp_path / "served" / "sweep"
    log = {"node0.rank0.log": "hello\n"}
    # 0: each file an absolute link out; 1: the same as ../../.. links, and no result.json, so that the
    # running job's files (.hydra, .mmt) are what would be read; 2: the dirs themselves link out
    absolute = make_job(sweep / "0", logs=log)
    relative = make_job(sweep / "1", logs=log)
    for name, target in files.items():
        _link(absolute / name, target)
        if name != "result.json":
            _link(relative / name, target, relative=True)
    linked_dirs = make_job(sweep / "2", logs=log)
    for folder in ("metrics", ".hydra", ".mmt"):
        _link(linked_dirs / folder, outside / folder)
    # 3: the control, a link that stays inside its job dir, is followed: the refusals above are the checks'
    control = make_job(sweep / "3", logs=log)
    (control / "train").mkdir()
    (control / "train" / "metrics.csv").write_text("step,train_loss\n0,2.0\n")
    _link(control / "metrics.csv", control / "train" / "metrics.csv", relative=True)

    client = client_for(tmp_path / "served")
    answers = _served_texts(client, sweep)
    assert [name for name, text in answers.items() if MARKER in text] == []
    for job in (absolute, relative, linked_dirs):
        detail = client.get(f"/api/jobs/{job_id(job)}").json()
        # no result, owner or config read: a job known by its logs alone (1 node x 1 rank, not 7 x 3)
        assert (detail["status"], detail["num_nodes"], detail["devices"], detail["machine"]) == (
            "PENDING",
            1,
            1,
            None,
        ), (job.name, detail)
        assert detail["overrides"] == [] and detail["failure"] is None and detail["error"] is None
        assert detail["metric_nodes"] == [] and detail["curves_version"] is None
        assert client.get(f"/api/jobs/{job_id(job)}/metrics").json() == {"nodes": []}
        assert client.get(f"/api/jobs/{job_id(job)}/curves").json() == {"step": [], "series": {}, "restarts": []}
    assert client.get(f"/api/jobs/{job_id(control)}/curves").json()["series"] == {"train_loss": [2.0]}


def test_a_non_loopback_host_is_refused_without_allow_remote(capsys):
    started = time.monotonic()
    assert server.main(["--host", "0.0.0.0"]) != 0
    err = capsys.readouterr().err
    assert "--allow-remote" in err and "0.0.0.0" in err and len(err.strip().splitlines()) == 1
    assert time.monotonic() - started < 5  # refused, not served
    assert server.is_loopback("127.0.0.1") and server.is_loopback("::1") and server.is_loopback("localhost")
    assert not server.is_loopback("0.0.0.0") and not server.is_loopback("8.8.8.8")


def test_a_busy_port_falls_back_to_a_free_one():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with server.bind("127.0.0.1", port) as sock:
            assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] != port


OWN_STATIC = ("index.html", "app.js", "style.css")  # the vendored uPlot names its home in its licence comment


def test_the_page_and_its_code_come_from_the_package_not_the_network():
    for name in OWN_STATIC:
        text = (STATIC_DIR / name).read_text()
        urls = [line.strip() for line in text.splitlines() if re.search(r"https?://", line, re.IGNORECASE)]
        assert urls == [], f"{name} names a URL (users may be offline): {urls}"
        # a protocol-relative //host/path in a string or url(): a CDN too
        assert not re.search(r"""["'(`]\s*//[\w.-]""", text), name
    # every script and stylesheet the page loads is one of the package's own files
    page = (STATIC_DIR / "index.html").read_text()
    loaded = re.findall(r"""<(?:script|link)\b[^>]*\b(?:src|href)=["']([^"']+)["']""", page)
    assert "static/app.js" in loaded and "static/vendor/uPlot.iife.min.js" in loaded
    for ref in loaded:
        if ref.startswith("data:"):  # the empty favicon, inline
            continue
        assert ref.startswith("static/") and (STATIC_DIR.parent / ref).is_file(), ref


@pytest.mark.parametrize("required", [True, False], ids=["required", "optional"])
def test_a_missing_selenium_fails_where_a_browser_is_required_and_skips_elsewhere(tmp_path, monkeypatch, required):
    monkeypatch.setitem(sys.modules, "selenium", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "selenium.webdriver", None)
    for name in ("CHROMIUM", "CHROMEDRIVER"):  # as if the browser were installed: selenium is what is missing
        monkeypatch.setattr(browser, name, Path(sys.executable))
    if required:
        monkeypatch.setenv("MMT_REQUIRE_BROWSER", "1")
    else:
        monkeypatch.delenv("MMT_REQUIRE_BROWSER", raising=False)
    try:  # a skip is an exception too: catch whatever comes, then say which it had to be
        with chromium(tmp_path, "no-tag"):
            raise AssertionError("a browser was driven without selenium")
    except BaseException as exc:  # noqa: BLE001
        outcome = exc
    expected = pytest.fail.Exception if required else pytest.skip.Exception
    assert type(outcome) is expected, repr(outcome)
    assert "selenium" in str(outcome)


def test_a_job_with_roles_lists_each_roles_logs_the_primarys_first_and_serves_only_those(tmp_path):
    """Role logs are in logs/<role>/ (each role numbers its own ranks): the page lists them by role, the primary's
    first (as the roles file orders them), and reads a role's log by that name; a name outside the listed logs is
    refused, as for any job."""
    job = make_job(tmp_path / "s" / "0")
    for name in ("trainer/node0.rank0.log", "trainer/node1.rank3.log", "scorer/node0.rank0.log"):
        (job / "logs" / name).parent.mkdir(parents=True, exist_ok=True)
        (job / "logs" / name).write_text(f"from {name}\n")
    roles = {"trainer": {"primary": True, "num_nodes": 2, "devices": 2}, "scorer": {"num_nodes": 1, "devices": 1}}
    (job / "roles.json").write_text(json.dumps({"primary": "trainer", "roles": roles}))
    listed = data.log_files(job)
    assert [(f.name, f.role, f.node, f.rank) for f in listed] == [
        ("trainer/node0.rank0.log", "trainer", 0, 0),
        ("trainer/node1.rank3.log", "trainer", 1, 3),
        ("scorer/node0.rank0.log", "scorer", 0, 0),
    ]
    path = data.log_path(job, "scorer/node0.rank0.log")
    assert path is not None and path.read_text() == "from scorer/node0.rank0.log\n"
    assert data.log_path(job, "scorer/node1.rank0.log") is None  # not one of its logs
    assert data.log_path(job, "../s/0/logs/scorer/node0.rank0.log") is None
    assert data.job_summary("x", job)["roles"] == "trainer 2 x 2 + scorer 1 x 1"  # the job list's topology
