#!/usr/bin/env bash
# scripts/ray_cluster.sh - a real, throw-away multi-node Ray cluster on ONE host, for cluster=ray.
#
# Used by mmt's Ray tests (tests/e2e/test_ray*.py), benchmarks/bench_ray.py and CI (.ci/run). Needs Ray in
# ./.venv (scripts/setup_ray.sh). No root, no namespaces: every node is a `ray start` of its own, with its own
# --node-ip-address on the loopback, its own ports and its own processes.
#
#   ray_cluster.sh start        start the head and the workers; wait until every node is alive
#   ray_cluster.sh stop         stop every process of the cluster (its nodes, their workers, jobs' drivers and
#                               ranks), found by the variable each one inherits (below); never another Ray
#   ray_cluster.sh restart      stop + start
#   ray_cluster.sh status       the nodes, alive or dead (exit 1 when the head does not answer, or a node is not
#                               alive)
#   ray_cluster.sh env          print `export RAY_API_SERVER_ADDRESS=...`; use: eval "$(ray_cluster.sh env)"
#   ray_cluster.sh purge        stop + delete $MMT_RAY_BASE (session dirs, logs)
#   ray_cluster.sh fail-node N  lose worker N (1..MMT_RAY_WORKERS) as a machine is lost: SIGKILL its raylet and
#                               every process of that node (its workers, agents, mmt's node agent and ranks);
#                               Ray's GCS holds it dead once its health checks fail (about 3 s here)
#   ray_cluster.sh revive-node N
#                               start worker N again and wait until it is alive
#   ray_cluster.sh pause-dashboard / resume-dashboard
#                               SIGSTOP / SIGCONT the head's dashboard (the job API) and its subprocesses: a
#                               dashboard that does not answer for a while (a network cut, an overloaded head)
#                               while the cluster and its jobs run on
#
# How it works
#   * The head (127.0.0.5 by default) holds no CPU (--num-cpus=0): it runs Ray's own services and the jobs'
#     drivers (mmt's placement, restarts and conclusion), never a job's ranks. Worker N is 127.0.0.(5+N), with
#     MMT_RAY_CPUS CPUs; the third worker is the spare a 2-node job restarts on when one of its nodes is lost.
#   * 127.0.0.1 is never used: Ray swaps a head address of 127.0.0.1 for the host's interface address. Every
#     other loopback address stays what it is, so the cluster talks over the loopback only.
#   * Every node shares this host's filesystem: a job dir is on a "shared filesystem" as mmt needs (docs/ray.md).
#   * Each node's processes inherit TEST_RAY_CLUSTER=<base> and TEST_RAY_NODE=<its address>: `stop` and
#     `fail-node` find exactly them (Ray renames many of its processes: ray::IDLE, ray::DashboardAgent ...).
#   * Ray's health checks are tightened (1 s period, 3 failures), so that a lost node is declared dead in
#     seconds, not the default 15+ s.
#   * Workers at niceness 0 (RAY_worker_niceness=0), not Ray's 15: on one shared host (CI runs other tests beside
#     the Ray tests), nice-15 workers got a thirtieth of a core behind them, and a node agent took 150 s instead of
#     6 s to import torch. On a real cluster a node's workers compete only with Ray's own daemons.
#   * No log monitors (--include-log-monitor=false): every node's would scan the one logs dir all nodes share
#     here (a seventh of a core, idle); workers' output is not streamed to drivers (mmt's ranks write their own
#     logs in the job dir, and a job's driver log is Ray's own: `ray job logs`).
#
# Knobs (environment variables):
#   MMT_RAY_BASE            base directory: Ray's temp dir (sessions, logs)            (/tmp/mmt-ray)
#   MMT_RAY_HEAD            the head's address (loopback, not 127.0.0.1)               (127.0.0.5)
#   MMT_RAY_WORKERS         number of workers, 127.0.0.(5+1) ... (1..4)                (3)
#   MMT_RAY_CPUS            CPUs declared per worker                                   (4)
#   MMT_RAY_PORT            the head's GCS port                                        (6390)
#   MMT_RAY_DASHBOARD_PORT  the dashboard: the job submission API and the state API    (8265)
#   MMT_RAY_PYTHON          the Python environment's bin dir that runs Ray             (.venv/bin)
set -euo pipefail
umask 022
cd "$(dirname "$0")/.."

BASE=${MMT_RAY_BASE:-/tmp/mmt-ray}
HEAD=${MMT_RAY_HEAD:-127.0.0.5}
WORKERS=${MMT_RAY_WORKERS:-3}
CPUS=${MMT_RAY_CPUS:-4}
PORT=${MMT_RAY_PORT:-6390}
DASHBOARD_PORT=${MMT_RAY_DASHBOARD_PORT:-8265}
BIN=$(cd "${MMT_RAY_PYTHON:-.venv/bin}" 2>/dev/null && pwd) || BIN=""

log() { echo "[ray_cluster $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

check_knobs() {
    [[ $BASE == /?*/?* && $BASE != *[[:space:]]* ]] ||
        die "MMT_RAY_BASE must be an absolute path like /tmp/mmt-ray, without spaces: '$BASE'"
    [[ $HEAD =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ && $HEAD != 127.0.0.1 ]] ||
        die "MMT_RAY_HEAD must be a loopback address other than 127.0.0.1 (Ray replaces that one): '$HEAD'"
    [[ $WORKERS =~ ^[1-4]$ ]] || die "MMT_RAY_WORKERS must be 1..4: '$WORKERS'"
    [[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "MMT_RAY_CPUS must be a whole number >= 1: '$CPUS'"
    [[ -x $BIN/ray && -x $BIN/python ]] ||
        die "no Ray in ${MMT_RAY_PYTHON:-.venv/bin} (run scripts/setup.sh, then scripts/setup_ray.sh)"
}

worker_ip() { echo "${HEAD%.*}.$((${HEAD##*.} + $1))"; }
address() { echo "http://$HEAD:$DASHBOARD_PORT"; }

# every Ray process started here runs with this environment
ray_env() {
    export PATH="$BIN:$PATH" TEST_RAY_CLUSTER="$BASE"
    export RAY_USAGE_STATS_ENABLED=0 RAY_health_check_period_ms=1000 RAY_health_check_failure_threshold=3
    export RAY_health_check_initial_delay_ms=1000 RAY_health_check_timeout_ms=1000
    unset RAY_ADDRESS RAY_API_SERVER_ADDRESS
}

# pids of live processes whose environment holds NAME=VALUE, and all their descendants (never this script's own).
# Both: Ray renames its workers and agents (setproctitle), which may overwrite what /proc shows of their
# environment; they are children of their node's raylet, which keeps it.
pids_with() {
    local file pid roots=()
    # -z: the environment's entries are NUL-separated; -x: the whole entry
    for file in $(grep -zlxsF -- "$1=$2" /proc/[0-9]*/environ 2>/dev/null); do
        pid=${file#/proc/}
        roots+=("${pid%/environ}")
    done
    ((${#roots[@]})) || return 0
    ps -e -o pid=,ppid=,stat= | awk -v roots="${roots[*]}" -v me="$$" -v child="$BASHPID" '
        { parent[$1] = $2; state[$1] = $3 }
        END {
            n = split(roots, r, " ")
            for (i = 1; i <= n; i++) keep[r[i]] = 1
            do {  # add the children of what is kept until nothing changes
                added = 0
                for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; added = 1 }
            } while (added)
            for (p in keep) if ((p in state) && p != me && p != child && state[p] !~ /^Z/) print p
        }'
}

# the cluster's nodes as the state API sees them: "address state" lines; exit 1 when the head does not answer
nodes() {
    "$BIN/python" - "$(address)" <<'PY'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/api/v0/nodes?limit=1000", timeout=5) as answer:
        rows = json.load(answer)["data"]["result"]["result"]
except Exception as exc:  # noqa: BLE001
    print(f"the head does not answer: {exc}", file=sys.stderr)
    sys.exit(1)
for row in sorted(rows, key=lambda r: (r["node_ip"], r["state"] != "ALIVE")):
    print(row["node_ip"], row["state"], "head" if row.get("is_head_node") else "", json.dumps(row["resources_total"]))
PY
}

alive() {  # alive IP: the node is ALIVE in the state API
    nodes 2>/dev/null | awk -v ip="$1" '$1 == ip && $2 == "ALIVE" {found = 1} END {exit !found}'
}

wait_alive() {
    local ip=$1 deadline=$((SECONDS + 90))
    until alive "$ip"; do
        ((SECONDS < deadline)) || die "node $ip is not alive after 90 s (see $BASE/session_latest/logs)"
        sleep 0.5
    done
}

start_head() {
    log "head $HEAD (GCS :$PORT, dashboard :$DASHBOARD_PORT)"
    TEST_RAY_NODE=$HEAD "$BIN/ray" start --head --node-ip-address="$HEAD" --port="$PORT" \
        --dashboard-host="$HEAD" --dashboard-port="$DASHBOARD_PORT" --num-cpus=0 --num-gpus=0 \
        --temp-dir="$BASE" --object-store-memory=$((100 * 1024 * 1024)) --dashboard-agent-listen-port=52365 \
        --min-worker-port=7000 --max-worker-port=7199 --ray-client-server-port=$((PORT + 1)) \
        --include-log-monitor=false --disable-usage-stats >"$BASE/start-head.log" 2>&1 ||
        { tail -20 "$BASE/start-head.log" >&2; die "the head did not start"; }
}

start_worker() {
    local n=$1 ip
    ip=$(worker_ip "$n")
    log "worker $n: $ip ($CPUS CPUs)"
    TEST_RAY_NODE=$ip RAY_worker_niceness=0 "$BIN/ray" start --address="$HEAD:$PORT" --node-ip-address="$ip" \
        --num-cpus="$CPUS" --num-gpus=0 --temp-dir="$BASE" --object-store-memory=$((100 * 1024 * 1024)) \
        --dashboard-agent-listen-port=$((52365 + n)) --min-worker-port=$((7000 + 200 * n)) \
        --max-worker-port=$((7199 + 200 * n)) --include-log-monitor=false --disable-usage-stats \
        >"$BASE/start-worker$n.log" 2>&1 ||
        { tail -20 "$BASE/start-worker$n.log" >&2; die "worker $n did not start"; }
    wait_alive "$ip"
}

kill_all() {  # kill_all SIGNAL PID...: each that is still there
    local sig=$1 pid
    shift
    for pid in "$@"; do kill "-$sig" "$pid" 2>/dev/null || true; done
}

dashboard_pids() {  # the head's dashboard process and its descendants
    local root
    root=$(pgrep -f -- "dashboard/dashboard.py --host=$HEAD --port=$DASHBOARD_PORT" | head -1)
    [[ -n $root ]] || die "no dashboard of $(address) runs here"
    ps -e -o pid=,ppid= | awk -v root="$root" '
        { parent[$1] = $2 }
        END { keep[root] = 1
              do { added = 0; for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; added = 1 } }
              while (added)
              for (p in keep) print p }'
}

cmd_signal_dashboard() {  # cmd_signal_dashboard SIGNAL WORD
    check_knobs
    local pids
    pids=$(dashboard_pids) || exit 1
    # shellcheck disable=SC2086 - one pid per word
    kill_all "$1" $pids
    log "the dashboard of $(address) $2"
}

cmd_start() {
    check_knobs
    ray_env
    if alive "$HEAD"; then
        log "already running ($(address))"
        cmd_status
        return
    fi
    [[ -z $(pids_with TEST_RAY_CLUSTER "$BASE") ]] || cmd_stop
    mkdir -p "$BASE"
    start_head
    wait_alive "$HEAD"
    local n
    for ((n = 1; n <= WORKERS; n++)); do start_worker "$n"; done
    log "ready: $(address) (eval \"\$(scripts/ray_cluster.sh env)\")"
    cmd_status
}

cmd_stop() {
    local left deadline
    left=$(pids_with TEST_RAY_CLUSTER "$BASE")
    [[ -n $left ]] || { log "not running"; return 0; }
    # SIGTERM first (Ray's own services flush and exit), SIGKILL what is left after 10 s
    # shellcheck disable=SC2086
    kill_all TERM $left
    deadline=$((SECONDS + 10))
    while [[ -n $(pids_with TEST_RAY_CLUSTER "$BASE") ]] && ((SECONDS < deadline)); do sleep 0.5; done
    left=$(pids_with TEST_RAY_CLUSTER "$BASE")
    # shellcheck disable=SC2086
    [[ -z $left ]] || kill_all KILL $left
    log "stopped"
}

cmd_status() {
    check_knobs
    local listed
    listed=$(nodes) || die "the head ($(address)) does not answer"
    echo "$listed"
    local n
    alive "$HEAD" || die "the head is not alive"
    for ((n = 1; n <= WORKERS; n++)); do
        alive "$(worker_ip "$n")" || die "worker $n ($(worker_ip "$n")) is not alive"
    done
}

cmd_env() {
    echo "export RAY_API_SERVER_ADDRESS=$(address)"
}

worker_arg() {
    [[ ${1:-} =~ ^[1-9]$ && $1 -le $WORKERS ]] || die "name a worker: 1..$WORKERS (worker N is $(worker_ip 1) ...)"
}

cmd_fail_node() {
    worker_arg "${1:-}"
    local ip pids raylet
    ip=$(worker_ip "$1")
    pids=$(pids_with TEST_RAY_NODE "$ip")
    [[ -n $pids ]] || die "worker $1 ($ip) has no processes (not running?)"
    # the raylet first, as when its machine goes: its workers and agents then find it gone
    raylet=$(pgrep -f -- "raylet/raylet .*--node_ip_address=$ip( |$)" || true)
    # shellcheck disable=SC2086
    kill_all KILL $raylet $pids
    log "worker $1 ($ip) lost: raylet ${raylet:-?} and $(wc -w <<<"$pids") process(es) SIGKILLed"
}

cmd_revive_node() {
    check_knobs
    worker_arg "${1:-}"
    ray_env
    local ip
    ip=$(worker_ip "$1")
    # shellcheck disable=SC2046
    kill_all KILL $(pids_with TEST_RAY_NODE "$ip")  # whatever the lost node left
    start_worker "$1"
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
restart) cmd_stop && cmd_start ;;
status) cmd_status ;;
env) cmd_env ;;
purge) cmd_stop && rm -rf "$BASE" ;;
fail-node) cmd_fail_node "${2:-}" ;;
pause-dashboard) cmd_signal_dashboard STOP paused ;;
resume-dashboard) cmd_signal_dashboard CONT resumed ;;
revive-node) cmd_revive_node "${2:-}" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
