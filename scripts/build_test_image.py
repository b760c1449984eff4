#!/usr/bin/env python3
"""Build the container image the tests run ranks in, offline, from this host's Python and a venv.

    .venv/bin/python scripts/build_test_image.py                 # prints the image name (podman)
    .venv/bin/python scripts/build_test_image.py --bundle DIR    # also an OCI bundle at DIR (SLURM's oci.conf)
    .venv/bin/python scripts/build_test_image.py --shell-only    # the same rootfs with /bin/sh alone (no sleep)
    .venv/bin/python scripts/build_test_image.py --pypy          # python3 of another minor version (Debian's pypy3)

Why a rootfs assembled from this host and not ``mmdebstrap`` plus ``pip install``: the tests must not pull from any
registry, and a second torch download (hundreds of MB) into a second Python would cost CI minutes. This host already
has the interpreter and the exact wheels the tests use: their files are hard-linked (no copy) into a rootfs, with
the shared libraries they link against, and ``podman import``-ed once. The image is cached by content: its tag is a
hash of this script, the interpreter and the name and version of every distribution it holds; a second build with
the same content does nothing.

The image holds python3 (``/usr/local/bin/python3``) with torch, Lightning, hydra-core, omegaconf and cloudpickle,
``/bin/sh`` and ``sleep``, ``/train.py`` (an all-reduce and a few DDP steps: the "image brings everything" shape) and
``/etc/mmt-test-image`` (a file only the image has). It does not hold mmt: the task-function shape mounts it.

Three more images, for the refusals: ``--without-python`` (the same rootfs without Python), ``--shell-only``
(``/bin/sh`` and the libraries it links, nothing else: no ``sleep``, no python3) and ``--pypy`` (a rootfs of Debian's
``pypy3`` package as ``python3``, bookworm's implementing Python 3.9, with ``/bin/sh`` and ``sleep``: a real
interpreter of another minor version than the launcher's; ``apt-get install pypy3`` first).
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Set

REPOSITORY = "localhost/mmt-test"
ROOTS = ("torch", "lightning", "hydra-core", "cloudpickle")  # what the two shapes need; mmt itself is not here
MARKER = "/etc/mmt-test-image"
HERE = Path(__file__).resolve().parent
IMAGE_FILES = HERE.parent / "tests" / "fixtures" / "image"
HOST_TOOLS = ("/bin/sh", "/bin/sleep", "/bin/cat")
# parts of the standard library no rank uses: left out of the image
STDLIB_SKIPPED = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(roots: Iterable[str]) -> List[metadata.Distribution]:
    """The roots and everything they require (markers evaluated for this interpreter, no extras)."""
    from packaging.requirements import Requirement

    installed = {_canonical(d.metadata["Name"]): d for d in metadata.distributions()}
    wanted: Dict[str, metadata.Distribution] = {}
    todo = [_canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        if name not in installed:
            sys.exit(f"build_test_image: {name} is not installed in {sys.prefix}; run scripts/setup.sh first")
        wanted[name] = installed[name]
        for line in installed[name].requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(_canonical(requirement.name))
    return sorted(wanted.values(), key=lambda d: _canonical(d.metadata["Name"]))


def content_key(dists: List[metadata.Distribution]) -> str:
    digest = hashlib.sha256()
    digest.update(Path(__file__).read_bytes())
    for path in sorted(IMAGE_FILES.rglob("*")):
        if path.is_file():
            digest.update(path.name.encode() + path.read_bytes())
    digest.update(sys.version.encode() + sys.executable.encode())
    for dist in dists:
        digest.update(f"{dist.metadata['Name']}=={dist.version}\n".encode())
    return digest.hexdigest()[:16]


def _place(source: Path, rootfs: Path, target: str) -> None:
    """Hard-link (or copy, across filesystems) one file into the rootfs at ``target``."""
    dest = rootfs / target.lstrip("/")
    if dest.exists() or dest.is_symlink():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.is_symlink() and not Path(os.path.realpath(source)).is_relative_to(source.parent):
        source = Path(os.path.realpath(source))
    try:
        os.link(source, dest, follow_symlinks=True)
    except OSError:
        shutil.copy2(source, dest)


def _shared_libraries(elf: Path) -> Set[str]:
    out = subprocess.run(["ldd", str(elf)], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            found.add(match.group(1))
    return found


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _host_tools_and_libraries(rootfs: Path, elves: List[Path]) -> None:
    """The host's sh, sleep and cat, and every shared library the binaries in ``elves`` (and those) link against,
    where the host has it (the ones a wheel bundles resolve to its own folder, already in the image)."""
    for tool in HOST_TOOLS:
        _place(Path(tool), rootfs, tool)
        elves.append(rootfs / tool.lstrip("/"))
    venv_site = Path(sysconfig.get_paths()["purelib"])
    libraries: Set[str] = set()
    for elf in elves:
        if _is_elf(elf):
            libraries |= _shared_libraries(elf)
    for library in sorted(libraries):
        path = Path(library)
        if path.is_relative_to(venv_site) or path.is_relative_to(rootfs):
            continue
        # libpython sits where the dynamic loader looks by default, not under pyenv's prefix
        target = f"/usr/lib/{path.name}" if path.name.startswith("libpython") else library
        _place(path, rootfs, target)
        real = os.path.realpath(library)
        if real != library:
            _place(Path(real), rootfs, real)


def _skeleton(rootfs: Path) -> None:
    for folder in ("tmp", "proc", "sys", "dev", "etc", "root", "run", "var/tmp"):
        (rootfs / folder).mkdir(parents=True, exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/nonexistent:/bin/sh\n")
    (rootfs / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (rootfs / MARKER.lstrip("/")).write_text("mmt's test image: a file only the image has\n")


def assemble(rootfs: Path, dists: List[metadata.Distribution]) -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    image_stdlib = f"/usr/local/lib/{version}"
    site = f"{image_stdlib}/site-packages"
    elves: List[Path] = []

    interpreter = Path(os.path.realpath(sys.executable))
    base = Path(os.path.realpath(os.path.join(sys.base_prefix, "bin", version)))
    _place(base if base.exists() else interpreter, rootfs, f"/usr/local/bin/{version}")
    elves.append(rootfs / f"usr/local/bin/{version}")
    for alias in ("python3", "python"):
        (rootfs / "usr/local/bin" / alias).symlink_to(version)
    (rootfs / "usr/bin").mkdir(parents=True, exist_ok=True)
    (rootfs / "usr/bin/python3").symlink_to(f"/usr/local/bin/{version}")

    for path in stdlib.rglob("*"):
        relative = path.relative_to(stdlib)
        if relative.parts[0] in STDLIB_SKIPPED or path.is_dir():
            continue
        _place(path, rootfs, f"{image_stdlib}/{relative}")
        if path.suffix == ".so":
            elves.append(rootfs / f"{image_stdlib.lstrip('/')}/{relative}")

    for dist in dists:
        for file in dist.files or ():
            source = Path(dist.locate_file(file))
            if not source.is_file() or str(file).startswith(".."):
                continue
            _place(source, rootfs, f"{site}/{file}")
            if ".so" in source.name:
                elves.append(rootfs / f"{site.lstrip('/')}/{file}")

    _host_tools_and_libraries(rootfs, elves)
    _skeleton(rootfs)
    # the bytecode too (the host's, for the same interpreter and the same hard-linked sources): without it every
    # container would compile torch's Python again at its first import, seconds of CPU per rank
    compile_all = [sys.executable, "-m", "compileall", "-q", "-j0", "-s", str(rootfs), "-p", "/"]
    subprocess.run([*compile_all, str(rootfs / image_stdlib.lstrip("/"))], check=False, stdout=subprocess.DEVNULL)
    shutil.copy2(IMAGE_FILES / "train.py", rootfs / "train.py")


PYPY_PACKAGES = ("pypy3", "pypy3-lib")


def pypy_files() -> List[Path]:
    """The files Debian's pypy3 installed (its interpreter, libpypy and its standard library), or exit saying what to
    install: a real interpreter of another minor version, not a script that prints one."""
    listed = subprocess.run(["dpkg", "-L", *PYPY_PACKAGES], capture_output=True, text=True)
    if listed.returncode != 0:
        sys.exit("build_test_image: --pypy needs Debian's pypy3 package: apt-get install pypy3")
    skipped = ("/usr/share/", "/usr/include/")
    paths = [Path(line) for line in listed.stdout.splitlines() if line.startswith("/") and not line.startswith(skipped)]
    return [path for path in paths if path.is_file() or path.is_symlink()]


def pypy_key() -> str:
    """The pypy image's content: this script, the packages' versions and the host's tools."""
    versions = subprocess.run(["dpkg-query", "-W", *PYPY_PACKAGES], capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256(Path(__file__).read_bytes() + versions.encode())
    for tool in HOST_TOOLS:
        digest.update(Path(os.path.realpath(tool)).read_bytes())
    return digest.hexdigest()[:16]


def assemble_pypy(rootfs: Path, files: List[Path]) -> None:
    """A rootfs whose python3 is pypy3 (with its standard library), with the host's sh and sleep: no torch, no mmt."""
    elves: List[Path] = []
    for path in files:
        if path.is_symlink() and not path.exists():
            continue
        if path.is_symlink():  # pypy3 -> pypy3.9: the same link in the image
            (rootfs / str(path).lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (rootfs / str(path).lstrip("/")).symlink_to(os.readlink(path))
            continue
        _place(path, rootfs, str(path))
        if _is_elf(path):
            elves.append(rootfs / str(path).lstrip("/"))
    (rootfs / "usr/bin/python3").symlink_to("pypy3")
    _host_tools_and_libraries(rootfs, elves)
    _skeleton(rootfs)


def runc_config(bundle: Path) -> None:
    """An OCI runtime config for SLURM's oci.conf: rootless runc, the host's network (MASTER_ADDR stays valid), and
    the host's /tmp, /var and /work visible (SLURM's job dirs and the project live there on the test cluster)."""
    config_path = bundle / "config.json"
    config_path.unlink(missing_ok=True)  # runc spec writes no file over an old one (a rebuilt image's bundle)
    subprocess.run(["runc", "spec", "--rootless", "--bundle", str(bundle)], check=True)
    config = json.loads(config_path.read_text())
    config["root"] = {"path": "rootfs", "readonly": False}
    namespaces = config["linux"]["namespaces"]
    config["linux"]["namespaces"] = [n for n in namespaces if n["type"] not in ("network", "uts")]
    config.pop("hostname", None)  # runc refuses to set one without a UTS namespace of its own
    config["process"]["terminal"] = False
    config_path.write_text(json.dumps(config, indent=2))


def _shell_only(rootfs: Path) -> Set[str]:
    """The archive names of ``/bin/sh`` and the libraries it links (and, for each link, what it points to)."""
    names = {"./bin/sh"}
    for library in _shared_libraries(rootfs / "bin/sh"):
        for path in (library, os.path.realpath(library)):
            names.add("." + path)
    return names


def import_image(
    runtime: str, rootfs: Path, image: str, without_python: bool = False, shell_only: bool = False
) -> None:
    if subprocess.run([runtime, "image", "inspect", image], capture_output=True).returncode == 0:
        return  # the same content is there already
    only = _shell_only(rootfs) if shell_only else None

    def keep(member: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
        if only is not None:  # the folders, the skeleton's files in /etc, sh and its libraries
            return member if member.isdir() or member.name.startswith("./etc/") or member.name in only else None
        return None if without_python and member.name.startswith(("./usr/local", "./usr/bin/python")) else member

    with tempfile.TemporaryDirectory(prefix="mmt-image.") as tmp:
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".", filter=keep)
        done = subprocess.run([runtime, "import", str(archive), image], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"build_test_image: {runtime} import failed: {done.stderr.strip()}")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="podman", help="the container CLI that imports the image (podman)")
    parser.add_argument("--bundle", help="also write an OCI bundle (rootfs + config.json) into this folder")
    parser.add_argument("--cache", default=os.environ.get("MMT_IMAGE_CACHE", str(Path.home() / ".cache/mmt/images")))
    parser.add_argument("--no-import", action="store_true", help="assemble the rootfs only (no container CLI)")
    variant = parser.add_mutually_exclusive_group()
    variant.add_argument(
        "--without-python", action="store_true", help="import an image of the same rootfs without Python"
    )
    variant.add_argument(
        "--shell-only", action="store_true", help="import an image of /bin/sh alone: no sleep, no python3"
    )
    variant.add_argument(
        "--pypy", action="store_true", help="import an image whose python3 is Debian's pypy3 (another minor version)"
    )
    args = parser.parse_args(argv)
    if args.pypy:
        return build_pypy(args)

    dists = distributions(ROOTS)
    key = content_key(dists)
    image = f"{REPOSITORY}:{key}"
    with staged_once(Path(args.cache), key, image, lambda rootfs: assemble(rootfs, dists)) as staged:
        if args.without_python:
            image = f"{REPOSITORY}-without-python:{key}"
        elif args.shell_only:
            image = f"{REPOSITORY}-shell-only:{key}"
        if not args.no_import:
            import_image(args.runtime, staged, image, without_python=args.without_python, shell_only=args.shell_only)
    if args.bundle:
        bundle = Path(args.bundle)
        if not (bundle / "config.json").exists() or os.path.realpath(bundle / "rootfs") != str(staged):
            bundle.mkdir(parents=True, exist_ok=True)
            if (bundle / "rootfs").is_symlink() or (bundle / "rootfs").exists():
                (bundle / "rootfs").unlink()
            (bundle / "rootfs").symlink_to(staged)
            runc_config(bundle)
    print(image)
    return 0


@contextlib.contextmanager
def staged_once(cache: Path, key: str, image: str, assemble_into: Callable[[Path], None]) -> Iterator[Path]:
    """The rootfs of ``key`` in ``cache``, assembled once, held under its lock: one builder at a time (two test
    workers may ask at once), the second finds the first one's rootfs (and image)."""
    staged = cache / key / "rootfs"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (staged.parent / "done").exists():
            shutil.rmtree(staged.parent, ignore_errors=True)
            staged.mkdir(parents=True)
            assemble_into(staged)
            (staged.parent / "done").write_text(image + "\n")
        yield staged


def build_pypy(args: argparse.Namespace) -> int:
    files = pypy_files()
    key = pypy_key()
    image = f"{REPOSITORY}-pypy:{key}"
    with staged_once(Path(args.cache), f"pypy-{key}", image, lambda rootfs: assemble_pypy(rootfs, files)) as staged:
        if not args.no_import:
            import_image(args.runtime, staged, image)
    print(image)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
