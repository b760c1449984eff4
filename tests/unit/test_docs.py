"""The docs stay true to the code and to themselves.

* docs/configuration.md lists every field of the launcher configs (``hydra_plugins/mmt_launcher/config.py``) with
  its backend and default, and no key that is not a field; every ``hydra.launcher.<key>`` named anywhere in the
  README or docs/ is a field;
* what configuration.md says a backend refuses (``refused on `cluster=local```, ``(SLURM only)`` ...) is what that
  backend refuses, and a key it says runs on both is refused by neither;
* the README stays a front door (under 12 KB);
* every relative link and image in README.md and docs/*.md points at a file that exists (and, for a page, at a
  heading that exists);
* no file of the repo cites the design document that is not in the repo.
"""

import dataclasses
import enum
import re
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIG_DOC = DOCS / "configuration.md"
README_LIMIT = 12 * 1024
# the heading of configuration.md whose tables list the launcher keys
LAUNCHER_SECTION = "Launcher keys"

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"``.+?``|`[^`]+`", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_LAUNCHER_KEY = re.compile(r"hydra\.launcher\.([A-Za-z_][A-Za-z0-9_]*)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def pages() -> List[Path]:
    return [README] + sorted(DOCS.glob("*.md"))


def prose(text: str) -> str:
    """Markdown with its fenced code blocks blanked (their lines may look like headings or links), lines kept."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


# ------------------------------------------------------------------------------------------ the launcher configs


def launcher_configs() -> Dict[str, Any]:
    """The launcher config dataclasses Hydra's ConfigStore holds, by backend name: each backend's own (its spec's
    ``config``), as the plugin stores them."""
    from mmt.backends import registry
    from mmt.backends.launchers import config_class

    found = {spec.name: config_class(spec) for spec in registry.specs() if spec.config is not None}
    assert found, "no launcher config dataclasses found in the backends' specs"
    return found


def _default_of(cls: Any, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return dataclasses.MISSING


def launcher_fields() -> Dict[str, Set[str]]:
    """Every public field of the launcher configs -> the backends whose config has it."""
    fields: Dict[str, Set[str]] = {}
    for backend, cls in launcher_configs().items():
        for f in dataclasses.fields(cls):
            if not f.name.startswith("_"):
                fields.setdefault(f.name, set()).add(backend)
    return fields


def render(value: Any) -> str:
    """A default as YAML spells it on the command line."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(render(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {render(item)}" for key, item in value.items()) + "}"
    return str(value)


def same_value(documented: str, actual: str) -> bool:
    if documented == actual:
        return True
    try:
        return float(documented) == float(actual)
    except ValueError:
        return False


@dataclasses.dataclass
class Row:
    keys: List[str]
    cells: Dict[str, str]
    line: str


def launcher_rows() -> List[Row]:
    """The rows of every table under configuration.md's launcher heading (up to the next heading of its level)."""
    text = prose(CONFIG_DOC.read_text())
    section = None
    for match in _HEADING.finditer(text):
        if match.group(2).startswith(LAUNCHER_SECTION):
            level = len(match.group(1))
            rest = text[match.end() :]
            end = re.search(rf"^#{{1,{level}}}\s", rest, re.M)
            section = rest[: end.start()] if end else rest
            break
    assert section is not None, f"{CONFIG_DOC.name} has no heading starting with {LAUNCHER_SECTION!r}"

    rows: List[Row] = []
    header: List[str] = []
    for line in section.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if not header:
            header = [cell.lower() for cell in cells]
            assert "key" in header, f"a launcher table without a 'key' column: {line}"
            continue
        if all(set(cell) <= set("-: ") for cell in cells):
            continue  # the separator row
        named = dict(zip(header, cells))
        rows.append(Row(keys=re.findall(r"`([^`]+)`", named["key"]), cells=named, line=line))
    assert rows, f"no launcher tables under {LAUNCHER_SECTION!r} in {CONFIG_DOC.name}"
    return rows


def test_every_launcher_field_is_documented_and_every_documented_key_is_a_field():
    fields = launcher_fields()
    documented: Dict[str, int] = {}
    for row in launcher_rows():
        for key in row.keys:
            documented[key] = documented.get(key, 0) + 1

    undocumented = sorted(set(fields) - set(documented))
    unknown = sorted(set(documented) - set(fields))
    twice = sorted(key for key, count in documented.items() if count > 1)
    assert not (undocumented or unknown or twice), (
        f"{CONFIG_DOC.relative_to(ROOT)} has drifted from hydra_plugins/mmt_launcher/config.py:\n"
        f"  fields without a row: {undocumented}\n"
        f"  rows that are not fields: {unknown}\n"
        f"  keys with more than one row: {twice}"
    )


def test_launcher_tables_give_each_key_its_backend_and_default():
    fields, configs = launcher_fields(), launcher_configs()
    everywhere = set(configs)
    problems: List[str] = []
    for row in launcher_rows():
        for key in row.keys:
            if key not in fields:
                continue  # reported by the test above
            if "backend" in row.cells:
                owners = fields[key]
                expected = "both" if owners == everywhere else ", ".join(sorted(owners))
                if row.cells["backend"] != expected:
                    problems.append(f"{key}: backend {row.cells['backend']!r}, config.py says {expected!r}")
            if "default" in row.cells:
                shown = re.findall(r"`([^`]+)`", row.cells["default"])
                for backend in sorted(fields[key]):
                    actual = render(_default_of(configs[backend], key))
                    if not any(same_value(token, actual) for token in shown):
                        problems.append(f"{key}: default shown {shown}, config.py's ({backend}) is {actual!r}")
    assert not problems, f"{CONFIG_DOC.relative_to(ROOT)} disagrees with config.py:\n  " + "\n  ".join(problems)


def test_every_hydra_launcher_key_named_in_the_docs_is_a_field():
    fields = launcher_fields()
    unknown: List[str] = []
    for page in pages():
        for key in sorted(set(_LAUNCHER_KEY.findall(page.read_text()))):
            if key not in fields:
                unknown.append(f"{page.relative_to(ROOT)}: hydra.launcher.{key}")
    assert not unknown, "keys that are not fields of the launcher configs:\n  " + "\n  ".join(unknown)


# ------------------------------------------------------------------------------- what the docs say of backends

# a backend a row says refuses its key: "refused on `cluster=local`", "refused on SLURM", "(SLURM only)" ...
_REFUSED_ON = re.compile(r"refused on (?:`cluster=)?(local|slurm)\b", re.I)
_ONLY_ON = re.compile(r"\((local|slurm) only\)", re.I)
_OTHER = {"local": "slurm", "slurm": "local"}
# keys whose value a backend may refuse, each with a value to plan with (a JobPlan field and its value)
RESTRICTION_SAMPLES: Dict[str, Tuple[str, Any]] = {
    "max_restarts": ("max_restarts", 1),
    "hang_timeout_min": ("hang_timeout_s", 600.0),
    "framework": ("framework", "jax"),
}


def _stated_refusals(text: str) -> Set[str]:
    refused = {m.lower() for m in _REFUSED_ON.findall(text)}
    refused |= {_OTHER[m.lower()] for m in _ONLY_ON.findall(text)}
    return refused


def _config_rows() -> Dict[str, str]:
    """Every key of configuration.md's tables (app keys and launcher keys) -> the text of its row."""
    rows: Dict[str, str] = {}
    for line in prose(CONFIG_DOC.read_text()).splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            for key in re.findall(r"`([^`]+)`", cells[0] if cells else ""):
                rows[key] = rows.get(key, "") + " " + line
    return rows


def _refused_by(key: str) -> Set[str]:
    """The backends whose planning refuses ``key`` set to its sample value."""
    from helpers.plans import local_plan
    from mmt.backends.local.backend import LocalBackend, LocalSettings
    from mmt.backends.slurm.backend import SlurmBackend

    field, value = RESTRICTION_SAMPLES[key]
    plan = local_plan(**{field: value})
    backends = {
        "local": LocalBackend(
            LocalSettings(max_parallel_ranks=4, master_addr="127.0.0.1", start_method="fork", kill_grace_s=1.0)
        ),
        "slurm": SlurmBackend.watcher(),
    }
    return {
        name
        for name, backend in backends.items()
        if any(problem.key in (key, f"hydra.launcher.{key}") for problem in backend.problems(plan))
    }


def test_every_restriction_stated_in_the_docs_is_one_a_backend_has():
    rows = _config_rows()
    stated = {key: _stated_refusals(text) for key, text in rows.items()}
    unchecked = sorted(key for key, refusals in stated.items() if refusals and key not in RESTRICTION_SAMPLES)
    assert not unchecked, f"{CONFIG_DOC.name} states a backend restriction this test cannot check: {unchecked}"
    wrong = []
    for key in RESTRICTION_SAMPLES:
        said, done = stated.get(key, set()), _refused_by(key)
        if said != done:
            wrong.append(
                f"{key}: the docs say it is refused on {sorted(said) or 'no backend'}, planning refuses it "
                f"on {sorted(done) or 'no backend'}"
            )
    assert not wrong, f"{CONFIG_DOC.name} disagrees with the backends:\n  " + "\n  ".join(wrong)


# ------------------------------------------------------------------------------------------ the README


def test_readme_is_a_front_door():
    size = len(README.read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes; keep it under {README_LIMIT} and move detail to docs/"


# ------------------------------------------------------------------------------------------ links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> Set[str]:
    found: Set[str] = set()
    seen: Dict[str, int] = {}
    for match in _HEADING.finditer(prose(page.read_text())):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> Iterator[Tuple[str, int]]:
    text = _CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose(page.read_text()))
    for match in _LINK.finditer(text):
        yield match.group(1), text.count("\n", 0, match.start()) + 1


def test_every_relative_link_points_at_an_existing_file():
    broken: List[str] = []
    checked = 0
    for page in pages():
        for target, line in links(page):
            if _SCHEME.match(target):
                continue  # http:, https:, mailto: ...
            path_part, _, anchor = target.partition("#")
            where = f"{page.relative_to(ROOT)}:{line}: {target}"
            resolved = (page.parent / path_part).resolve() if path_part else page
            checked += 1
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where} (no heading #{anchor} in {resolved.relative_to(ROOT)})")
    assert checked, "no relative links found: the link pattern is wrong"
    assert not broken, "broken links:\n  " + "\n  ".join(broken)


def test_readme_links_every_docs_page():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target, _ in links(README)}
    missing = [str(page.relative_to(ROOT)) for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


# ------------------------------------------------------------------------------------------ no phantom design doc


def repo_files() -> List[Path]:
    """Every file git tracks, and those it would track (new, not ignored) that exist in the work tree."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout ({error})")
    names = sorted({name for name in out.decode().split("\0") if name})
    return [ROOT / name for name in names if (ROOT / name).is_file()]


def test_no_file_cites_the_missing_design_document():
    needle = "DESIGN" + ".md"  # spelled at run time, so that this file does not cite it
    citing: List[str] = []
    for path in repo_files():
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (the docs' pictures ...)
        if needle in data.decode("utf-8", errors="replace"):
            citing.append(str(path.relative_to(ROOT)))
    assert not citing, f"files that cite {needle}, which is not in this repo: {citing}"
