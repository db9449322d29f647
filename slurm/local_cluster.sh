#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine (for tests and CI; needs root and Debian's slurm-wlm + munge).
#
#   bash slurm/local_cluster.sh          # start (idempotent): munged, slurmctld, slurmd; wait until the node is idle
#   bash slurm/local_cluster.sh stop     # stop the daemons
#
# The node is this host with all its CPUs; cgroup plugins are off (proctrack/linuxproc, task/none) so it works
# inside containers and VMs without a cgroup hierarchy of its own.
set -euo pipefail

if [ "${1:-start}" = "stop" ]; then
  pkill -x slurmd || true; pkill -x slurmctld || true; pkill -x munged || true
  exit 0
fi

HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
CONF_DIR=/etc/slurm
STATE=/var/spool/slurmctld
mkdir -p "$CONF_DIR" "$STATE" /var/spool/slurmd /var/log/slurm /run/munge /var/lib/munge /var/log/munge /etc/munge

cat > "$CONF_DIR/slurm.conf" <<CONF
ClusterName=selfplay-local
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
EnforcePartLimits=ALL
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=10
MinJobAge=300
JobRequeue=1
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
rm -f "$CONF_DIR/cgroup.conf"  # no cgroup plugin: proctrack/linuxproc + task/none need none

if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd

for _ in $(seq 1 60); do
  if sinfo -h -o "%t" 2>/dev/null | grep -qE "^(idle|mix|alloc)"; then
    echo "slurm: node $HOST up with $CPUS CPUs"; exit 0
  fi
  scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm: the node did not come up; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
sinfo >&2 || true
exit 1
