"""``mmt dashboard`` as a process: the command serves on loopback and stops, and the live page in a real headless
Chromium follows a running 2 x 2 job. (Reading job dirs, the API and its refusals: tests/unit/test_dashboard.py.)"""

import contextlib
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.app import app_command, app_env, run_app
from helpers.browser import chromium
from helpers.dashboard import make_job, make_outputs, result_record
from helpers.paths import REPO
from mmt.dashboard import data


@pytest.fixture
def outputs(tmp_path) -> Path:
    """outputs/multirun/<date>/<time>/<job>: a finished sweep of three jobs (one failed) and a running job."""
    return make_outputs(tmp_path)


@contextlib.contextmanager
def dashboard(roots, tag):
    """``python -m mmt.dashboard ROOTS --port 0`` in a subprocess; yields the URL it prints."""
    process = subprocess.Popen(
        [sys.executable, "-m", "mmt.dashboard", *map(str, roots), "--port", "0"],
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        assert lines and "http://127.0.0.1:" in lines[0], f"no URL printed: {lines}"
        yield lines[0].split()[2]
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_command_serves_on_loopback_and_stops(outputs, tag):
    import httpx

    with dashboard([outputs], tag) as url:
        assert url.startswith("http://127.0.0.1:")
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.get(url + "api/jobs", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the dashboard did not answer"
                time.sleep(0.2)
        assert response.status_code == 200 and len(response.json()["sweeps"]) == 2
        # raw request lines, as a client that does not normalise paths sends them
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        for path in (
            "/static/../data.py",
            "/static/../../jobdir.py",
            "/static/%2e%2e/data.py",
            "/static/..%2f..%2fjobdir.py",
            "/api/jobs/..%2f..%2f",
        ):
            with socket.create_connection((host, int(port)), timeout=5) as conn:
                conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
                reply = b"".join(iter(lambda: conn.recv(65536), b""))
            assert reply.startswith(b"HTTP/1.1 404") and b"import" not in reply, (path, reply[:200])


ARTIFACTS = REPO / "outputs" / "test-artifacts"


def wait_for(what, condition, timeout_s, interval_s=0.25):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def dom_counts(driver):
    """What the page shows: the log's line count, each node's CPU chart's point count, the job's status."""
    return driver.execute_script("""
        const log = document.getElementById("log");
        const charts = [...document.querySelectorAll('.chart[data-kind="cpu"]')];
        return {lines: log ? Number(log.dataset.lines) : -1, log: log ? log.dataset.name : null,
                points: Object.fromEntries(charts.map((c) => [c.dataset.node, Number(c.dataset.points)])),
                status: document.querySelector("#view h2 .status")?.textContent || null,
                noReload: window.__noReload === 1};
    """)


@pytest.mark.browser
@pytest.mark.slow
def test_the_live_page_follows_a_running_2x2_job_and_shows_a_failure(tmp_path, tag):
    runs = tmp_path / "runs"
    runs.mkdir()
    job_dir = runs / "lm" / "0"
    output = tmp_path / "job.out"
    job_output = output.open("w")
    with dashboard([runs], tag) as url, chromium(tmp_path, tag) as driver:
        job = subprocess.Popen(
            app_command("num_nodes=2", "devices=2", sweep_dir=runs / "lm"),
            cwd=REPO,
            env=app_env(tag),
            stdout=job_output,
            stderr=subprocess.STDOUT,
        )
        try:
            driver.get(url)
            driver.execute_script("window.__noReload = 1")  # gone if the page ever reloads
            row = f'a.job[data-job="{data.opaque_id(job_dir.resolve())}"]'

            def listed_or_ended():
                if job.poll() is not None:
                    raise AssertionError(f"the job ended before it was listed:\n{output.read_text()[-3000:]}")
                return driver.find_elements("css selector", row)

            wait_for("the job in the list", listed_or_ended, 120)

            def status():
                return driver.find_element("css selector", f"{row} .status").text

            wait_for("the job shown RUNNING", lambda: status() == "RUNNING" or job.poll() is not None, 60)
            assert job.poll() is None, "the job ended before the page saw it run"
            driver.find_element("css selector", row).click()
            first = wait_for("the rank-0 log", lambda: (c := dom_counts(driver))["lines"] > 0 and c, 120)
            assert first["log"] == "node0.rank0.log"
            # watch while it runs: the log and each node's charts must grow in place
            seen_points, grown_points, grown_lines, shot, ended = {}, set(), False, False, None
            while not (grown_lines and grown_points >= {"0", "1"} and shot):
                counts = dom_counts(driver)
                grown_lines |= counts["lines"] > first["lines"]
                for node, points in counts["points"].items():
                    if points and node not in seen_points:
                        seen_points[node] = points
                    elif node in seen_points and points > seen_points[node]:
                        grown_points.add(node)
                if (
                    not shot
                    and grown_points >= {"0", "1"}
                    and min(counts["points"].values()) >= 8
                    and counts["status"] == "RUNNING"
                ):
                    driver.save_screenshot(str(tmp_path / "dashboard.png"))  # the live job page
                    shot = True
                if job.poll() is not None:
                    ended = ended or time.monotonic()
                    if time.monotonic() > ended + 6:
                        break  # a few polls after the end, for the last lines
                time.sleep(0.3)
            assert job.wait(240) == 0, output.read_text()[-3000:]
            if not shot:
                driver.save_screenshot(str(tmp_path / "dashboard.png"))
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(tmp_path / "dashboard.png", ARTIFACTS / "dashboard.png")
            assert grown_lines, f"the rank-0 log did not grow on the page: {first} -> {dom_counts(driver)}"
            assert dom_counts(driver)["noReload"], "the page reloaded"
            metrics_files = sorted(p.name for p in (job_dir / "metrics").glob("node*.jsonl"))

            # the training curves chart: every step of metrics.csv drawn
            steps = len(data.training_curves(job_dir)["step"])
            curve_points = "return document.querySelector('.chart[data-kind=\"curve_loss\"]')?.dataset.points"
            wait_for(
                f"{steps} points on the training curves",
                lambda: steps > 0 and driver.execute_script(curve_points) == str(steps),
                20,
            )

            # the rank filter: pick rank 2 (node 1); its lines replace rank 0's
            from selenium.webdriver.support.select import Select

            rank0 = (job_dir / "logs" / "node0.rank0.log").read_text(errors="replace")
            rank2 = (job_dir / "logs" / "node1.rank2.log").read_text(errors="replace")
            assert rank2.strip() and rank2 != rank0
            ranks = Select(driver.find_element("id", "log-select"))
            ranks.select_by_value("node1.rank2.log")
            assert ranks.first_selected_option.text == "rank 2 (node 1)"
            shown_text = "return document.getElementById('log').textContent"

            def rank2_shown() -> bool:
                counts = dom_counts(driver)
                return (
                    counts["log"] == "node1.rank2.log"
                    and counts["lines"] > 0
                    and rank2.endswith(driver.execute_script(shown_text))
                )

            wait_for("rank 2's log on the page", rank2_shown, 20)
            shown = driver.execute_script(shown_text)
            assert shown.strip() and not rank0.endswith(shown), "the page still shows rank 0's lines"

            # a failing job in another sweep of the same DIR: its traceback on the page
            failed = run_app(
                "recipe=probe",
                "num_nodes=1",
                "devices=2",
                "recipe.fail_rank=1",
                sweep_dir=runs / "fail",
                tag=tag,
                timeout=120,
            )
            assert failed.returncode != 0
            failed_row = f'a.job[data-job="{data.opaque_id((runs / "fail" / "0").resolve())}"]'
            wait_for("the failed job", lambda: driver.find_elements("css selector", failed_row), 30)
            driver.find_element("css selector", failed_row).click()
            traceback = "return document.querySelector('#failure .traceback')?.textContent || ''"
            wait_for(
                "the traceback",
                lambda: "ProbeFault: injected failure on rank 1" in driver.execute_script(traceback),
                30,
            )
            assert (
                "rank 1 (node 0): ProbeFault: injected failure on rank 1"
                in driver.find_element("css selector", "#failure .what").text
            )
            assert driver.find_element("css selector", f"{failed_row} .status").text == "FAILED"
            assert dom_counts(driver)["noReload"], "the page reloaded"
        finally:
            if job.poll() is None:
                job.terminate()  # the launcher stops its ranks on SIGTERM
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait()
            job_output.close()
    # last, so that the checks above still run where the node agent does not sample
    assert metrics_files == ["node0.jsonl", "node1.jsonl"], (
        f"the 2 x 2 job left metrics files {metrics_files}: the node agent's sampler did not write both nodes"
    )
    assert grown_points >= {"0", "1"}, (
        f"node charts did not gain points live: first {seen_points}, grown {sorted(grown_points)}"
    )


@pytest.mark.browser
def test_a_restarted_job_shows_its_earlier_runs_and_a_mark_where_the_restart_took_over(tmp_path, tag):
    """What the restart of a real job leaves (result.json's earlier_runs; metrics.csv whose steps go back to the
    checkpoint), drawn by a real browser: a dashed mark on each training chart, and every earlier run listed."""
    runs = tmp_path / "runs"
    csv = "epoch,step,train_loss,val_loss\n" + "".join(f"0,{s},{9 - s / 10},\n" for s in range(8))
    csv += "".join(f"0,{s},{9 - s / 10 - 0.01},\n" for s in range(5, 12))  # resumed from step 5
    earlier = [{"restart": 0, "error": "rank 3 (node 1) was killed by SIGKILL", "duration_s": 12.5}]
    job_dir = make_job(runs / "restarted" / "0", result=result_record(0, earlier_runs=earlier, restarts=1), csv=csv)
    with dashboard([runs], tag) as url, chromium(tmp_path, tag) as driver:
        driver.get(url)
        row = f'a.job[data-job="{data.opaque_id(job_dir.resolve())}"]'
        wait_for("the job in the list", lambda: driver.find_elements("css selector", row), 60)
        driver.find_element("css selector", row).click()
        marks = "return document.querySelector('.chart[data-kind=\"curve_loss\"]')?.dataset.marks"
        wait_for("one restart mark on the loss chart", lambda: driver.execute_script(marks) == "1", 60)
        listed = driver.execute_script("return [...document.querySelectorAll('.runs li')].map((li) => li.textContent)")
        assert listed == ["run 0 failed after 12.5 s: rank 3 (node 1) was killed by SIGKILL"], listed
        facts = driver.find_element("css selector", "#view .facts").text
        assert "restarts 1" in facts, facts
