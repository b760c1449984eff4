"""``<job dir>/metrics/node<n>.jsonl``: one node's machine metrics, a JSON object per line (``t``, CPU, memory,
the job's processes, GPUs ...), written by its agent's sampler (``mmt.monitor.sampler``) and read one way by every
reader (the live page, the tests): a line still being written, or one that is not a sample, is left out."""

import json
import math
from pathlib import Path
from typing import Any, Dict, List


def parse_samples(data: bytes) -> List[Dict[str, Any]]:
    """The samples of a metrics file's bytes, in time order; what follows the last newline is a line still being
    written, and is ignored."""
    samples = []
    for line in data.split(b"\n")[:-1]:
        try:
            sample = json.loads(line)
        except ValueError:
            continue
        t = sample.get("t") if isinstance(sample, dict) else None
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
            samples.append(sample)
    samples.sort(key=lambda s: s["t"])  # a sampler thinning old samples keeps order; be safe anyway
    return samples


def read_samples(path: Path) -> List[Dict[str, Any]]:
    """Every complete sample of a metrics file (none when it cannot be read)."""
    try:
        return parse_samples(path.read_bytes())
    except OSError:
        return []
