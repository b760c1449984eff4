"""What a sweep's summary.png says it plots (its PNG text chunk), and what a drawn figure's axes show."""

import json
from pathlib import Path
from typing import Any, Dict, List, Set

from PIL import Image

from mmt.monitor.plots import PLOTTED_KEY

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def axis_labels(ax) -> Set[str]:
    """Every series an axis draws (lines, scatter, bars) and every legend entry, by label."""
    found = {artist.get_label() for artist in [*ax.get_lines(), *ax.collections, *ax.containers]}
    legend = ax.get_legend()
    return found | ({text.get_text() for text in legend.get_texts()} if legend else set())


def plotted(png: Path) -> Dict[str, Any]:
    """What the summary.png on disk says it plots (its text chunk), not what a fresh drawing would show."""
    with Image.open(png) as image:
        assert image.format == "PNG"
        return json.loads(image.text[PLOTTED_KEY])


def plotted_jobs(png: Path) -> List[tuple]:
    return [(job["dir"], job["label"], job["status"]) for job in plotted(png)["jobs"]]
