#!/usr/bin/env bash
# scripts/slurm_cluster.sh - a real, throw-away multi-node SLURM cluster on ONE Debian 12 host.
#
# Used by mmt's SLURM tests and by CI (.ci/run). Needs root, util-linux `unshare`, and apt
# (only the first time, to install the Debian packages).
#
#   slurm_cluster.sh start     install missing packages, start munged, [mariadbd + slurmdbd],
#                              slurmctld and one slurmd per node; wait until every node is idle
#   slurm_cluster.sh stop      cancel all jobs, stop the daemons this script started, kill the
#                              processes left in the node namespaces (job steps, tasks)
#   slurm_cluster.sh restart   stop + start
#   slurm_cluster.sh status    daemons + sinfo (exit 1 if a daemon is not running)
#   slurm_cluster.sh env       print `export SLURM_CONF=...`; use: eval "$(slurm_cluster.sh env)"
#   slurm_cluster.sh purge     stop + delete $MMT_SLURM_BASE (state, accounting DB, logs, key)
#   slurm_cluster.sh fail-node NODE
#                              lose NODE as a machine is lost: SIGKILL its slurmd and every process
#                              in its namespaces (job steps, tasks); slurmctld marks it DOWN once it
#                              has not answered for MMT_SLURM_NODE_TIMEOUT s
#   slurm_cluster.sh revive-node NODE [NODE ...]
#                              start each NODE's slurmd again and wait until the nodes are idle
#
# How it works
#   * Everything (configs, munge key and socket, state, spool, logs, database) lives under
#     $MMT_SLURM_BASE. Nothing is written to /etc; clients find the cluster via SLURM_CONF.
#   * munged runs with its own key and socket. slurm.conf points at that socket with
#     AuthInfo=socket=..., and with AccountingStoragePass=... for the clients of slurmdbd
#     (slurmctld, sacct, sacctmgr), which ignore AuthInfo.
#   * One slurmd per node (`slurmd -N nodeX`, one port per node), each in its own mount+UTS
#     namespace: hostname == node name, and a bind-mounted /etc/hosts maps nodeX -> 127.0.1.X
#     (plus /etc/slurm -> $MMT_SLURM_BASE/etc when /etc/slurm exists). Jobs inherit this, so
#     `hostname` == SLURMD_NODENAME and MASTER_ADDR=node1 resolves inside jobs. There is no
#     network namespace: every node shares the host's loopback and filesystem, so the host can
#     reach a port opened by a task on node1 at 127.0.1.1 (node names do NOT resolve on the
#     host itself).
#   * No cgroups (proctrack/linuxproc, task/none); select/cons_tres with CR_CPU;
#     SlurmdParameters=config_overrides lets a node declare more CPUs than the host has.
#   * Requeue/signal testing: JobRequeue=1 (batch jobs may be requeued with `scontrol requeue`,
#     also from inside the job), KillOnBadExit=0 (the launcher passes --kill-on-bad-exit itself).
#   * Containers: SLURM's own OCI support (srun --container BUNDLE) through oci.conf, where runc is
#     installed: rootless runc, its state under $BASE/runc/<user>, one container per task named
#     node.user.job.step.task (22.05 knows no scrun and no %U). crun fails on hybrid cgroups.
#   * Accounting (default on): a throw-away MariaDB (skip-grant-tables, 127.0.0.1 only) and
#     slurmdbd, so that `sacct` works. submitit needs sacct to notice cancelled/killed jobs.
#
# Knobs (environment variables):
#   MMT_SLURM_BASE        base directory                             (/tmp/mmt-slurm)
#   MMT_SLURM_NODES       number of nodes, node1..nodeN; the third is the spare a job lands on
#                         when a node is lost                        (3)
#   MMT_SLURM_CPUS        CPUs declared per node                     (4)
#   MMT_SLURM_PORT0       first port: slurmctld=+1, slurmdbd=+2, mariadb=+3, slurmd nodeX=+10+X
#                         (7800: below 10000-32767, where mmt derives a job's MASTER_PORT and
#                         framework ports from its job id; the daemons' ports there failed the
#                         jobs whose ids map onto them, once a big sweep took the ids that far)
#   MMT_SLURM_ACCOUNTING  1 = slurmdbd + MariaDB (sacct works), 0 = none   (1)
#   MMT_SLURM_PARTITION   name of the single (default) partition     (debug)
#   MMT_SLURM_CLUSTER     ClusterName                                (mmt)
#   MMT_SLURM_INSTALL     1 = apt-get install missing packages, 0 = fail instead   (1)
#   MMT_SLURM_NODE_TIMEOUT  SlurmdTimeout: a node that has not answered for this long is DOWN
#                         and its jobs end NODE_FAIL (requeued where they may be)     (10)
#   MMT_SLURM_CRED_EXPIRE job credential lifetime in s; a requeued job waits this long + 1 s
#                         before it can start again (Slurm's default is 120)        (10)
# Two clusters at once need a different MMT_SLURM_BASE and MMT_SLURM_PORT0 (node addresses
# are shared: 127.0.1.X).
set -euo pipefail
umask 022

BASE=${MMT_SLURM_BASE:-/tmp/mmt-slurm}
NODES=${MMT_SLURM_NODES:-3}
NODE_TIMEOUT=${MMT_SLURM_NODE_TIMEOUT:-10}
CPUS=${MMT_SLURM_CPUS:-4}
PORT0=${MMT_SLURM_PORT0:-7800}
ACCOUNTING=${MMT_SLURM_ACCOUNTING:-1}
PARTITION=${MMT_SLURM_PARTITION:-debug}
CLUSTER=${MMT_SLURM_CLUSTER:-mmt}
INSTALL=${MMT_SLURM_INSTALL:-1}
CRED_EXPIRE=${MMT_SLURM_CRED_EXPIRE:-10}

log() { echo "[slurm_cluster $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

check_knobs() {
    # at least two levels deep (purge deletes it), no spaces (they would break slurm.conf)
    [[ $BASE == /?*/?* && $BASE != *[[:space:]]* ]] ||
        die "MMT_SLURM_BASE must be an absolute path like /tmp/mmt-slurm, without spaces: '$BASE'"
    [[ $NODES =~ ^[1-9][0-9]*$ ]] || die "MMT_SLURM_NODES must be 1..254: '$NODES'"
    ((NODES <= 254)) || die "MMT_SLURM_NODES must be 1..254: '$NODES'"
    [[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "MMT_SLURM_CPUS must be a positive integer: '$CPUS'"
    [[ $CRED_EXPIRE =~ ^[1-9][0-9]*$ ]] || die "MMT_SLURM_CRED_EXPIRE must be a positive integer: '$CRED_EXPIRE'"
    [[ $PORT0 =~ ^[1-9][0-9]*$ ]] || die "MMT_SLURM_PORT0 must be a port number: '$PORT0'"
    ((PORT0 >= 1024 && PORT0 + 10 + NODES < 65536)) || die "MMT_SLURM_PORT0 out of range: '$PORT0'"
    [[ $ACCOUNTING == [01] ]] || die "MMT_SLURM_ACCOUNTING must be 0 or 1: '$ACCOUNTING'"
    [[ $PARTITION =~ ^[A-Za-z0-9_-]+$ ]] || die "bad MMT_SLURM_PARTITION: '$PARTITION'"
    [[ $CLUSTER =~ ^[a-z0-9_]+$ ]] || die "bad MMT_SLURM_CLUSTER (lower case, digits, _): '$CLUSTER'"
}
check_knobs

CTLD_PORT=$((PORT0 + 1))
DBD_PORT=$((PORT0 + 2))
DB_PORT=$((PORT0 + 3))
ETC=$BASE/etc
RUN=$BASE/run
LOG=$BASE/log
MUNGE_DIR=$BASE/munge
DB_DIR=$BASE/mysql
MUNGE_SOCK=$MUNGE_DIR/munge.socket.2
export SLURM_CONF=$ETC/slurm.conf

# Debian packages; accounting adds the last four. All plugins used are in slurm-wlm-basic-plugins
# (a dependency), except accounting_storage/mysql (slurm-wlm-mysql-plugin).
PKGS=(slurmctld slurmd slurm-client munge)
ACCT_PKGS=(slurmdbd slurm-wlm-mysql-plugin mariadb-server-core mariadb-client-core)

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "node$i"; done; }

# Serialise start/stop/purge (e.g. parallel test workers). The daemons must not inherit the
# lock fd (fd 9), or the lock would stay held as long as they run: see launch().
take_lock() {
    mkdir -p "$BASE"
    exec 9>"$BASE/.lock"
    flock -w 300 9 || die "could not lock $BASE/.lock within 300 s"
}

# ---------------------------------------------------------------------------------------------
# Process helpers. We only ever signal a pid that we recorded in a pid file AND whose process
# name matches, so a recycled pid is never hit.
pid_alive() { # pid_alive PID COMM: exists, has that name, and is not a zombie
    [[ $1 =~ ^[0-9]+$ && -r /proc/$1/comm ]] || return 1
    [[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]] || return 1
    ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}
alive() { # alive PIDFILE COMM
    [[ -s $1 ]] && pid_alive "$(<"$1")" "$2"
}
stop_pid() { # stop_pid PID COMM TIMEOUT_S: SIGTERM, wait, then SIGKILL
    local pid=$1 comm=$2 t=$3 i
    pid_alive "$pid" "$comm" || return 0
    STOPPED+=("$pid")
    log "stopping $comm (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    # wait on /proc/PID, not on the pid file: daemons delete it as soon as shutdown starts
    for ((i = 0; i < t * 10; i++)); do pid_alive "$pid" "$comm" || return 0; sleep 0.1; done
    log "$comm (pid $pid) still alive after ${t} s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do pid_alive "$pid" "$comm" || return 0; sleep 0.1; done
}
STOPPED=() # pids signalled by this run of the script
# Daemonized processes are reparented to PID 1, which reaps them. In containers PID 1 may do that
# late, so a stopped daemon can linger as <defunct> for a few seconds: wait for it (max 10 s).
wait_reaped() {
    local i pid left
    for ((i = 0; i < 100; i++)); do
        left=0
        for pid in "${STOPPED[@]}"; do [[ -e /proc/$pid ]] && left=$((left + 1)); done
        ((left == 0)) && return 0
        sleep 0.1
    done
    log "$left stopped process(es) not yet reaped by PID 1 (zombies, harmless)"
}
stop_pidfile() { # stop_pidfile PIDFILE COMM TIMEOUT_S
    [[ -s $1 ]] && stop_pid "$(<"$1")" "$2" "$3"
    rm -f "$1"
}
# Start a daemon with nothing inherited but stdin=/dev/null and stdout/stderr to $LOG/NAME.out.
# Every other fd is closed: our lock, and any pipe of the caller (a CI runner or a test that
# captures our output would otherwise wait for EOF as long as the daemon runs).
launch() { # launch NAME CMD [ARGS...]
    local name=$1
    shift
    (
        for fd in /proc/"$BASHPID"/fd/*; do
            fd=${fd##*/}
            if ((fd > 2)); then eval "exec $fd>&-"; fi
        done
        exec "$@"
    ) </dev/null >>"$LOG/$name.out" 2>&1
}
wait_port() { # wait_port PORT SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
# Daemons of THIS cluster that have no (valid) pid file any more, e.g. after a crash or a
# deleted $BASE: matched by name AND by our paths in their command line or SLURM_CONF.
stray_daemons() {
    local p pid comm
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        comm=$(cat "$p/comm" 2>/dev/null) || continue
        case $comm in munged | mariadbd | slurmdbd | slurmctld | slurmd | slurmstepd) ;; *) continue ;; esac
        pid_alive "$pid" "$comm" || continue
        if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qF -- "$BASE/" ||
            tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qxF -- "SLURM_CONF=$SLURM_CONF"; then
            echo "$pid $comm"
        fi
    done
}

stop_strays() {
    local pid comm
    while read -r pid comm; do
        [[ -n $pid ]] || continue
        log "stray $comm (pid $pid) of this cluster (no pid file)"
        stop_pid "$pid" "$comm" 10
    done < <(stray_daemons)
    wait_reaped
}

# ---------------------------------------------------------------------------------------------
install_pkgs() {
    local pkgs=("${PKGS[@]}") missing=() p t0=$SECONDS
    [[ $ACCOUNTING == 1 ]] && pkgs+=("${ACCT_PKGS[@]}")
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    [[ $INSTALL == 1 ]] || die "missing packages: ${missing[*]} (MMT_SLURM_INSTALL=0)"
    command -v apt-get >/dev/null || die "missing packages: ${missing[*]} and no apt-get"
    log "installing: ${missing[*]}"
    # On an image without /usr/sbin/policy-rc.d the munge postinst may also start the system
    # munged on /run/munge: harmless (we use our own), but it is an extra process.
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    log "packages installed in $((SECONDS - t0)) s"
}

# Write $2 to $1 only if it changed (keeps a running cluster's files untouched on a re-start).
put_file() { # put_file PATH CONTENT [MODE]
    local f=$1
    if [[ -f $f ]] && [[ $(<"$f") == "$2" ]]; then
        [[ -z ${3:-} ]] || chmod "$3" "$f"
        return 0
    fi
    printf '%s\n' "$2" >"$f.tmp"
    [[ -z ${3:-} ]] || chmod "$3" "$f.tmp"
    mv -f "$f.tmp" "$f"
}

slurm_conf() {
    local mem_mb i
    mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
    cat <<EOF
# Generated by scripts/slurm_cluster.sh - do not edit (rewritten on start).
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((PORT0 + 10))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire (default 120 s) is also how long a requeued job must wait before it may start again
AuthInfo=socket=$MUNGE_SOCK,cred_expire=$CRED_EXPIRE
CredType=cred/munge
StateSaveLocation=$BASE/state
# multiple slurmd on one host: %n = node name
SlurmdSpoolDir=$BASE/spool/%n
SlurmdPidFile=$RUN/slurmd.%n.pid
SlurmdLogFile=$LOG/slurmd.%n.log
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# start jobs right away, and run the periodic scheduling passes every second instead of every
# 60 s (main) / 30 s (backfill): a requeued job whose BeginTime has passed only starts on such a
# pass. Cheap on a tiny cluster.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
MpiDefault=none
SwitchType=switch/none
PlugStackConfig=$ETC/plugstack.conf
MailProg=/bin/true
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=$NODE_TIMEOUT
InactiveLimit=0
MinJobAge=300
# SIGTERM to SIGKILL on scancel: the batch script's last step (mmt's conclusion) runs in this window; SLURM's
# default is 30 s, and 5 s was too short for it on a host loaded by three test workers
KillWait=15
Waittime=0
# preemption / requeue tests: scontrol requeue of running batch jobs is allowed; a task that
# exits non-zero does not kill its step unless the launcher asks for --kill-on-bad-exit
JobRequeue=1
KillOnBadExit=0
EOF
    if [[ $ACCOUNTING == 1 ]]; then
        cat <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# slurmdbd clients (slurmctld, sacct, sacctmgr) take the munge socket from here, not from AuthInfo
AccountingStoragePass=$MUNGE_SOCK
EOF
    else
        echo "AccountingStorageType=accounting_storage/none"
    fi
    for ((i = 1; i <= NODES; i++)); do
        echo "NodeName=node$i NodeAddr=127.0.1.$i Port=$((PORT0 + 10 + i)) CPUs=$CPUS RealMemory=$mem_mb State=UNKNOWN"
    done
    echo "PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
}

# SLURM 22.05's oci.conf: RunTimeRun starts a task's container in the foreground (runc deletes it when
# its process ends); Query/Kill/Delete are what slurmstepd asks when it stops a step. Written only where
# runc is installed (without it srun --container fails, and mmt's container_runtime=oci says so).
oci_conf() {
    local runc="runc --rootless=true --root=$BASE/runc/%u" id="%n.%u.%j.%s.%t"
    cat <<EOF
# Generated by scripts/slurm_cluster.sh - do not edit (rewritten on start).
RunTimeQuery="$runc state $id"
RunTimeKill="$runc kill -a $id SIGTERM"
RunTimeDelete="$runc delete --force $id"
RunTimeRun="$runc run $id --bundle %b"
EOF
}

slurmdbd_conf() {
    cat <<EOF
# Generated by scripts/slurm_cluster.sh - do not edit (rewritten on start).
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=root
StorageLoc=slurm_acct_db
EOF
}

my_cnf() {
    cat <<EOF
# Generated by scripts/slurm_cluster.sh. Throw-away test database: no users, no passwords
# (skip-grant-tables, so no mysql_install_db either), reachable on 127.0.0.1 only.
[mariadbd]
datadir=$DB_DIR/data
socket=$DB_DIR/mysqld.sock
pid-file=$RUN/mariadbd.pid
log-error=$LOG/mariadbd.log
bind-address=127.0.0.1
port=$DB_PORT
user=root
skip-grant-tables
skip-name-resolve
performance_schema=OFF
innodb_buffer_pool_size=32M
innodb_log_file_size=16M
innodb_lock_wait_timeout=900
innodb_use_native_aio=0
key_buffer_size=1M
EOF
}

hosts_file() {
    local i
    # the host's entries, minus any old nodeX lines, plus our node addresses
    grep -vE '^[^#]*[[:space:]]node[0-9]+([[:space:]]|$)' /etc/hosts || true
    for ((i = 1; i <= NODES; i++)); do echo "127.0.1.$i node$i"; done
}

write_configs() {
    local n new running=0
    mkdir -p "$ETC" "$RUN" "$LOG" "$BASE/state" "$MUNGE_DIR"
    chmod 755 "$BASE" "$MUNGE_DIR" # munged: every directory on the socket path must be o+x
    for n in $(node_names); do mkdir -p "$BASE/spool/$n"; done
    new=$(slurm_conf)
    alive "$RUN/slurmctld.pid" slurmctld && running=1
    if ((running)) && [[ -f $SLURM_CONF && $(<"$SLURM_CONF") != "$new" ]]; then
        die "the cluster is running with a different configuration (knobs changed?): use 'restart'"
    fi
    put_file "$SLURM_CONF" "$new"
    put_file "$ETC/hosts" "$(hosts_file)"
    put_file "$ETC/plugstack.conf" "# empty: no SPANK plugins"
    put_file "$BASE/env.sh" "export SLURM_CONF=$SLURM_CONF"
    if command -v runc >/dev/null; then
        mkdir -p "$BASE/runc"
        chmod 1777 "$BASE/runc" # each user's runc state in a dir of its own (%u), made by runc
        put_file "$ETC/oci.conf" "$(oci_conf)"
    else
        rm -f "$ETC/oci.conf"
    fi
    if [[ $ACCOUNTING == 1 ]]; then
        mkdir -p "$DB_DIR/data"
        put_file "$ETC/slurmdbd.conf" "$(slurmdbd_conf)" 600 # slurmdbd refuses a readable file
        put_file "$DB_DIR/my.cnf" "$(my_cnf)"
    fi
}

# ---------------------------------------------------------------------------------------------
start_munge() {
    alive "$RUN/munged.pid" munged && { log "munged already running"; return 0; }
    [[ -s $MUNGE_DIR/munge.key ]] || mungekey --create --keyfile="$MUNGE_DIR/munge.key"
    chmod 600 "$MUNGE_DIR/munge.key"
    launch munged munged --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCK" \
        --pid-file="$RUN/munged.pid" --log-file="$LOG/munged.log" --seed-file="$MUNGE_DIR/munged.seed" ||
        die "munged failed to start (see $LOG/munged.out, $LOG/munged.log)"
    munge -S "$MUNGE_SOCK" -n </dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null ||
        die "munge self-test failed (see $LOG/munged.log)"
    log "munged up (pid $(<"$RUN/munged.pid"))"
}

start_accounting() {
    local i
    if alive "$RUN/mariadbd.pid" mariadbd; then
        log "mariadbd already running"
    else
        # mariadbd does not daemonize itself
        launch mariadbd setsid -f mariadbd --defaults-file="$DB_DIR/my.cnf"
        wait_port "$DB_PORT" 60 || die "mariadbd did not open port $DB_PORT (see $LOG/mariadbd.log)"
        for ((i = 0; i < 50; i++)); do alive "$RUN/mariadbd.pid" mariadbd && break; sleep 0.1; done
        alive "$RUN/mariadbd.pid" mariadbd || die "mariadbd wrote no pid file $RUN/mariadbd.pid"
        log "mariadbd up (pid $(<"$RUN/mariadbd.pid"), port $DB_PORT)"
    fi
    if alive "$RUN/slurmdbd.pid" slurmdbd; then
        log "slurmdbd already running"
    else
        launch slurmdbd slurmdbd || die "slurmdbd failed to start (see $LOG/slurmdbd.out, $LOG/slurmdbd.log)"
        for ((i = 0; i < 600; i++)); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.1; done
        sacctmgr -n list cluster >/dev/null 2>&1 || die "slurmdbd not answering on port $DBD_PORT (see $LOG/slurmdbd.log)"
        log "slurmdbd up (pid $(<"$RUN/slurmdbd.pid"), port $DBD_PORT)"
    fi
}

start_ctld() {
    local i
    alive "$RUN/slurmctld.pid" slurmctld && { log "slurmctld already running"; return 0; }
    launch slurmctld slurmctld || die "slurmctld failed to start (see $LOG/slurmctld.out, $LOG/slurmctld.log)"
    for ((i = 0; i < 300; i++)); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
    scontrol ping 2>/dev/null | grep -q UP || die "slurmctld not answering on port $CTLD_PORT (see $LOG/slurmctld.log)"
    log "slurmctld up (pid $(<"$RUN/slurmctld.pid"), port $CTLD_PORT)"
}

start_node() { # start_node NAME
    local n=$1 pf=$RUN/slurmd.$1.pid i pid mnt uts
    alive "$pf" slurmd && { log "slurmd $n already running"; return 0; }
    # Own mount+UTS namespace: private /etc/hosts (+ /etc/slurm), hostname == node name.
    # slurmd daemonizes; the namespaces live as long as it or any of its job steps.
    # shellcheck disable=SC2016 # $1..$4 are expanded by the inner sh
    launch "slurmd.$n" unshare --mount --uts --propagation private -- /bin/sh -c '
        mount --bind "$1/hosts" /etc/hosts || exit 1
        if [ "$4" = 1 ]; then mount --bind "$1" /etc/slurm || exit 1; fi
        hostname "$2" && exec slurmd -N "$2" -f "$3"' \
        sh "$ETC" "$n" "$SLURM_CONF" "$([[ -d /etc/slurm ]] && echo 1 || echo 0)" ||
        die "slurmd $n failed to start (see $LOG/slurmd.$n.out, $LOG/slurmd.$n.log)"
    for ((i = 0; i < 100; i++)); do alive "$pf" slurmd && break; sleep 0.1; done
    alive "$pf" slurmd || die "slurmd $n did not start (see $LOG/slurmd.$n.out, $LOG/slurmd.$n.log)"
    pid=$(<"$pf")
    mnt=$(readlink "/proc/$pid/ns/mnt") uts=$(readlink "/proc/$pid/ns/uts")
    [[ $mnt != "$(readlink /proc/self/ns/mnt)" && $uts != "$(readlink /proc/self/ns/uts)" ]] ||
        die "slurmd $n is not in its own namespaces"
    # remember the node's namespaces (and the boot) to find its leftover processes on stop
    echo "$(</proc/sys/kernel/random/boot_id) $mnt $uts" >"$RUN/$n.ns"
    log "slurmd $n up (pid $pid, 127.0.1.${n#node}:$((PORT0 + 10 + ${n#node})))"
}

wait_idle() {
    local i bad
    for ((i = 0; i < 300; i++)); do
        bad=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 !~ /^(idle|alloc|mix)$/' || true)
        [[ -z $bad ]] && sinfo -h -N -o '%N' 2>/dev/null | grep -q . && return 0
        if ((i == 50)); then # after an unclean stop, nodes can stay down or drained: resume them
            echo "$bad" | awk '$2 ~ /down|drain|fail/ {print $1}' | while read -r n; do
                log "resuming $n"
                scontrol update NodeName="$n" State=RESUME 2>/dev/null || true
            done
        fi
        sleep 0.1
    done
    sinfo -N >&2 || true
    die "nodes not idle after 30 s (see $LOG/)"
}

cmd_start() {
    local t0=$SECONDS n
    [[ $(id -u) == 0 ]] || die "must run as root (daemons, namespaces, bind mounts)"
    command -v unshare >/dev/null || die "unshare (util-linux) not found"
    take_lock
    install_pkgs
    write_configs
    start_munge
    [[ $ACCOUNTING == 0 ]] || start_accounting
    start_ctld
    for n in $(node_names); do start_node "$n"; done
    wait_idle
    log "cluster up in $((SECONDS - t0)) s"
    sinfo
    cat <<EOF

SLURM cluster '$CLUSTER' is up: $NODES nodes (node1..node$NODES = 127.0.1.1..127.0.1.$NODES), $CPUS CPUs each, partition '$PARTITION'.
  eval "\$($0 env)"         # export SLURM_CONF=$SLURM_CONF
  srun -N$NODES --ntasks-per-node=2 hostname
  sbatch ... ; squeue ; sacct -j <id> -o JobID,State,ExitCode
  $0 stop                 # or: purge (also deletes $BASE)
Node names resolve only inside jobs; from the host use the addresses 127.0.1.X.
Logs: $LOG
EOF
}

# Kill every process still living in a node's namespaces (slurmstepd, job tasks). Used after
# slurmd is gone: job steps outlive their slurmd.
kill_ns_leftovers() { # kill_ns_leftovers NODE
    local n=$1 boot mnt uts p pid
    [[ -s $RUN/$n.ns ]] || return 0
    read -r boot mnt uts <"$RUN/$n.ns"
    rm -f "$RUN/$n.ns"
    [[ $boot == "$(</proc/sys/kernel/random/boot_id)" ]] || return 0 # from an earlier boot
    # never the host's own namespaces (that would be every process on the machine)
    [[ $mnt != "$(readlink /proc/self/ns/mnt)" && $uts != "$(readlink /proc/self/ns/uts)" ]] || return 0
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [[ $pid != "$$" ]] || continue
        [[ $(readlink "$p/ns/mnt" 2>/dev/null) == "$mnt" && $(readlink "$p/ns/uts" 2>/dev/null) == "$uts" ]] || continue
        log "killing leftover pid $pid ($(cat "$p/comm" 2>/dev/null)) of $n"
        kill -KILL "$pid" 2>/dev/null || true
    done
}

cmd_stop() {
    local t0=$SECONDS n i ids wait_s=20
    if [[ ! -d $BASE ]]; then
        stop_strays
        log "nothing else to stop ($BASE does not exist)"
        return 0
    fi
    take_lock
    if alive "$RUN/slurmctld.pid" slurmctld; then
        ids=$(squeue -h -o %A 2>/dev/null || true)
        if [[ -n $ids ]]; then
            log "cancelling jobs: ${ids//$'\n'/ }"
            # shellcheck disable=SC2086 # one argument per job id
            scancel $ids 2>/dev/null || true
            # a job on a node whose slurmd died never finishes COMPLETING: don't wait long for it
            for n in $(node_names); do alive "$RUN/slurmd.$n.pid" slurmd || wait_s=3; done
            for ((i = 0; i < wait_s * 10; i++)); do [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break; sleep 0.1; done
            [[ -z $(squeue -h -o %A 2>/dev/null) ]] ||
                log "jobs still listed after $wait_s s: $(squeue -h -o '%A:%T' | tr '\n' ' ') (their processes are killed below)"
        fi
    fi
    # the nodes of this configuration + any node that left a pid or namespace file
    for n in $({
        node_names
        find "$RUN" -maxdepth 1 \( -name 'slurmd.*.pid' -o -name 'node*.ns' \) -printf '%f\n' 2>/dev/null |
            sed -e 's/^slurmd\.//' -e 's/\.pid$//' -e 's/\.ns$//'
    } | sort -u); do
        stop_pidfile "$RUN/slurmd.$n.pid" slurmd 10
        kill_ns_leftovers "$n"
    done
    stop_pidfile "$RUN/slurmctld.pid" slurmctld 20
    stop_pidfile "$RUN/slurmdbd.pid" slurmdbd 20
    stop_pidfile "$RUN/mariadbd.pid" mariadbd 60
    stop_pidfile "$RUN/munged.pid" munged 10
    stop_strays
    log "stopped in $((SECONDS - t0)) s"
}

cmd_status() {
    local f comm rc=0
    for f in munged:munged mariadbd:mariadbd slurmdbd:slurmdbd slurmctld:slurmctld \
        $(node_names | sed 's/.*/slurmd.&:slurmd/'); do
        comm=${f#*:} f=${f%%:*}
        if alive "$RUN/$f.pid" "$comm"; then
            echo "$f: running (pid $(<"$RUN/$f.pid"))"
        elif [[ ($f == mariadbd || $f == slurmdbd) && $ACCOUNTING != 1 ]]; then
            echo "$f: disabled (MMT_SLURM_ACCOUNTING=0)"
        else
            echo "$f: not running"
            rc=1
        fi
    done
    if alive "$RUN/slurmctld.pid" slurmctld; then
        sinfo -N
        squeue
    fi
    return $rc
}

cmd_fail_node() { # fail-node NODE
    local n=${1:-}
    [[ $n =~ ^node[0-9]+$ ]] || die "usage: $0 fail-node NODE (e.g. node2)"
    alive "$RUN/slurmd.$n.pid" slurmd || die "$n: slurmd is not running"
    take_lock
    kill -KILL "$(<"$RUN/slurmd.$n.pid")"
    rm -f "$RUN/slurmd.$n.pid"
    kill_ns_leftovers "$n"
    log "$n lost: slurmd and its processes killed; slurmctld marks it DOWN after ${NODE_TIMEOUT} s without an answer"
}

cmd_revive_node() { # revive-node NODE [NODE ...]: every node started before the wait (the others may be down too)
    local n
    [[ $# -gt 0 ]] || die "usage: $0 revive-node NODE [NODE ...] (e.g. node2)"
    for n in "$@"; do [[ $n =~ ^node[0-9]+$ ]] || die "usage: $0 revive-node NODE [NODE ...] (e.g. node2)"; done
    take_lock
    for n in "$@"; do
        start_node "$n"
        scontrol update NodeName="$n" State=RESUME 2>/dev/null || true
    done
    wait_idle
}

cmd_purge() {
    cmd_stop
    log "removing $BASE"
    rm -rf -- "$BASE"
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop && cmd_start ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$SLURM_CONF" ;;
    purge) cmd_purge ;;
    fail-node) cmd_fail_node "${2:-}" ;;
    revive-node) shift; cmd_revive_node "$@" ;;
    *)
        echo "usage: $0 {start|stop|restart|status|env|purge|fail-node NODE|revive-node NODE...}" >&2
        exit 2
        ;;
esac
