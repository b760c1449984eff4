"""What the test image's own script (/train.py, tests/fixtures/image/train.py) reports from each rank."""

import json
from pathlib import Path
from typing import List


def image_results(job_dir: Path) -> List[dict]:
    """Every rank's ``MMT_IMAGE_RESULT {json}`` line from the job's logs, in rank order."""
    found = []
    for log in sorted((job_dir / "logs").glob("node*.rank*.log")):
        for line in log.read_text().splitlines():
            if line.startswith("MMT_IMAGE_RESULT "):
                found.append(json.loads(line.split(" ", 1)[1]))
    return sorted(found, key=lambda r: r["rank"])
