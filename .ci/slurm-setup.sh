#!/usr/bin/env bash
# A single-node SLURM on this (Debian) machine, for the launcher tests
# (tests/hardening/test_slurm.py): munge, slurmctld and slurmd started by hand,
# one node "localhost"-style with 2 CPUs. Idempotent: a second call returns as
# soon as `sinfo` answers. Needs root (CI runs as root). Under a minute once
# the packages are installed.
set -euo pipefail

if command -v sinfo >/dev/null 2>&1 && timeout 5 sinfo -h -o '%T' 2>/dev/null | grep -Eq 'idle|mix|alloc'; then
    exit 0  # already up
fi
if [ "$(id -u)" != 0 ]; then
    echo "slurm-setup: needs root (apt-get, daemons)" >&2
    exit 1
fi
if ! command -v slurmd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
fi

host=$(hostname -s)
mkdir -p /etc/slurm /var/lib/slurm/slurmd /var/lib/slurm/slurmctld /var/log/slurm /run/munge
cat > /etc/slurm/slurm.conf <<CONF
# Written by .ci/slurm-setup.sh: one node, no cgroups (containers lack them), no accounting.
ClusterName=ci
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/lib/slurm/slurmd
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=${host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=ci Nodes=${host} Default=YES MaxTime=INFINITE State=UP
CONF

# munge: the key comes with the package; the daemon runs as its own user.
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged
fi

pgrep -x slurmctld >/dev/null || slurmctld -c          # -c: ignore state from an earlier setup
pgrep -x slurmd >/dev/null || slurmd -N "${host}"

for _ in $(seq 1 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -Eq 'idle|mix|alloc'; then
        exit 0
    fi
    scontrol update nodename="${host}" state=resume >/dev/null 2>&1 || true
    sleep 0.5
done
echo "slurm-setup: the node did not come up; see /var/log/slurm/" >&2
sinfo >&2 || true
exit 1
