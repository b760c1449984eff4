"""What the test image's own script (/train.py, tests/fixtures/image/train.py) reports from each rank; the podman
containers a job left."""

import json
import subprocess
from pathlib import Path
from typing import List

from helpers.app import job_dirs


def image_results(job_dir: Path) -> List[dict]:
    """Every rank's ``MMT_IMAGE_RESULT {json}`` line from the job's logs, in rank order."""
    found = []
    for log in sorted((job_dir / "logs").glob("node*.rank*.log")):
        for line in log.read_text().splitlines():
            if line.startswith("MMT_IMAGE_RESULT "):
                found.append(json.loads(line.split(" ", 1)[1]))
    return sorted(found, key=lambda r: r["rank"])


def containers_of(job: str) -> list:
    """The containers labelled with this job id, or with this job dir."""
    label = f"mmt.job_dir={job}" if job.startswith("/") else f"mmt.job={job}"
    listed = subprocess.run(["podman", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def assert_no_containers_left(sweep: Path) -> None:
    for job_dir in job_dirs(sweep):
        assert containers_of(str(job_dir)) == [], f"containers left for {job_dir}"
