#!/usr/bin/env bash
# A one-node SLURM cluster on 127.0.0.1, for trying `ablate.py --launcher slurm` without a cluster
# (tests/ablation/test_slurm_sweep.py and .ci/run use it). Root only: slurmd runs the jobs.
#
#   scripts/local_slurm.sh install        # Debian's slurmctld, slurmd and munge (apt-get), if missing
#   scripts/local_slurm.sh start DIR      # munged, slurmctld, slurmd with their files in DIR
#   export SLURM_CONF=DIR/slurm.conf      # then sbatch, squeue, ablate.py --launcher slurm use it
#   scripts/local_slurm.sh stop DIR       # stops the daemons it started in DIR (their pid files)
#
# Its own ports, key and munge socket: it leaves a SLURM or munge already on the machine alone.
set -euo pipefail

command=${1:-}
dir=${2:-}
ctld_port=${MINITX_SLURM_PORT:-16817}

usage() {
    echo "usage: $0 install | start DIR | stop DIR" >&2
    exit 2
}

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd munge >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd munge >/dev/null; }
}

start() {
    [ "$(id -u)" = 0 ] || { echo "$0: start runs slurmd, which needs root" >&2; exit 2; }
    mkdir -p "$dir"/{ctld,spool,munge}
    dir=$(cd "$dir" && pwd)
    node=$(hostname -s)
    cpus=$(nproc)
    memory=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
    [ -f "$dir/munge/munge.key" ] || { head -c 1024 /dev/urandom >"$dir/munge/munge.key"; chmod 400 "$dir/munge/munge.key"; }
    cat >"$dir/slurm.conf" <<EOF
ClusterName=minitx-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
MessageTimeout=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
    echo "ConstrainCores=no" >"$dir/cgroup.conf"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munge.seed"
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -i  # -i: a fresh cluster, ignoring any state in StateSaveLocation
    slurmd -N "$node"
    for _ in $(seq 60); do  # the node answers within seconds
        if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
            echo "$0: SLURM up on 127.0.0.1:$ctld_port, node $node ($cpus CPUs); export SLURM_CONF=$dir/slurm.conf"
            return
        fi
        sleep 1
    done
    echo "$0: the node did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
    stop
    exit 1
}

stop() {
    [ -d "$dir" ] || return 0
    dir=$(cd "$dir" && pwd)
    # Its jobs first (their steps would outlive slurmd), then each daemon it started.
    if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
        export SLURM_CONF="$dir/slurm.conf"
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 60); do
            [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break
            sleep 1
        done
    fi
    # By the pid files it wrote in DIR.
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        if [ -f "$pidfile" ]; then
            pid=$(cat "$pidfile")
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            rm -f "$pidfile"
        fi
    done
}

case "$command" in
    install) install ;;
    start) [ -n "$dir" ] || usage; install; start ;;
    stop) [ -n "$dir" ] || usage; stop ;;
    *) usage ;;
esac
