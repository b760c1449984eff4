"""``mmt dashboard [DIR ...] [--port P] [--host H] [--allow-remote] [--open]``: serve the page with uvicorn.

Loopback only unless ``--host`` names another address *and* ``--allow-remote`` is given: the page shows logs
and paths, and has no authentication. The socket is bound here, before uvicorn starts, so that a busy port
falls back to a free one without a race, and the URL printed is the one served.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
import webbrowser
from collections.abc import Callable
from pathlib import Path

DEFAULT_PORT = 8765
FALLBACK_TRIES = 10  # DEFAULT_PORT+1 ... before asking the OS for any free port


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mmt dashboard",
        description="A live page of mmt jobs: status, node metrics, training curves and per-rank logs, read "
        "from their job dirs.",
    )
    parser.add_argument(
        "dirs",
        nargs="*",
        metavar="DIR",
        type=Path,
        help="sweep dirs, job dirs, or a parent such as outputs/ (default: ./outputs)",
    )
    parser.add_argument(
        "--port", type=int, default=None, help=f"port (default {DEFAULT_PORT}); a busy port falls back to a free one"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that is not loopback (whoever can reach it can read the logs)",
    )
    parser.add_argument("--open", action="store_true", help="open the page in a browser")
    return parser.parse_args(argv)


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is loopback (``localhost`` is resolved, not trusted by name)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def bind(host: str, port: int | None) -> socket.socket:
    """A listening socket on ``port`` (default DEFAULT_PORT), else the next ones, else any free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    wanted = DEFAULT_PORT if port is None else port
    candidates = [wanted] + ([wanted + i for i in range(1, FALLBACK_TRIES)] if wanted else []) + [0]
    last_error: OSError | None = None
    for candidate in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), candidate))
            sock.listen(128)
            return sock
        except OSError as exc:
            sock.close()
            last_error = exc
    raise last_error or OSError(f"cannot bind {host}")


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def serve(
    sock: socket.socket, roots: list[Path], extra_job_dirs: Callable[[], list[Path]] | None = None, remote: bool = False
) -> None:
    """Serve the dashboard on ``sock`` until interrupted (uvicorn handles SIGINT and SIGTERM)."""
    import uvicorn

    from mmt.dashboard.app import LOOPBACK_HOSTS, create_app

    host = sock.getsockname()[0]
    own_name = f"[{host}]" if ":" in host else host  # a loopback alias such as 127.0.0.2, as browsers send it
    app = create_app(roots, extra_job_dirs, allowed_hosts=["*"] if remote else [*LOOPBACK_HOSTS, own_name])
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str] | None = None, extra_job_dirs: Callable[[], list[Path]] | None = None) -> int:
    args = parse_args(argv)
    if args.port is not None and not 0 <= args.port <= 65535:
        print(f"mmt dashboard: Invalid --port {args.port}: expected a port 0-65535 (0: any free port)", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and not args.allow_remote:
        print(
            f"mmt dashboard: refusing to serve on {args.host}, which is not loopback: the page has no "
            "authentication. HINT: add --allow-remote to serve it there anyway",
            file=sys.stderr,
        )
        return 2
    roots = args.dirs or [Path("outputs")]
    missing = [str(d) for d in roots if not d.exists()]
    if missing and args.dirs:
        print(f"mmt dashboard: no such dir: {', '.join(missing)} (watching for it)", file=sys.stderr)
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        print(f"mmt dashboard: cannot listen on {args.host}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    url = url_of(sock)
    wanted = DEFAULT_PORT if args.port is None else args.port
    if wanted and sock.getsockname()[1] != wanted:
        print(f"mmt dashboard: port {wanted} is busy", file=sys.stderr)
    print(f"mmt dashboard: {url} ({', '.join(str(r) for r in roots)})", flush=True)
    if args.open:
        webbrowser.open(url)
    try:
        serve(sock, roots, extra_job_dirs, remote=not is_loopback(args.host))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
