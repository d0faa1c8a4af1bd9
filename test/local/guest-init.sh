#!/bin/bash
# The qemu guest's first program after switch_root (test/local/render.py's /init runs it):
# mount what a Linux system needs, run the cluster and its tests, write the exit status
# into the results share, and power off.
# Usage: guest-init.sh PYTHON CLUSTER_PY RESULTS [HOST_TMP_PATH ...]
# Each HOST_TMP_PATH (under /tmp: the binaries, the checkout, the venv) is bound from the
# host's /tmp into the guest's own /tmp at the same place.
set -u
python=$1 cluster=$2 results=$3
shift 3
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# containerd's overlay snapshots cannot sit on the root's overlay: /tmp and /run are tmpfs.
mkdir -p /host-tmp
mount --bind /tmp /host-tmp
mount -t tmpfs -o size=50% tmpfs /tmp
for kept in "$@"; do
  mkdir -p "$kept"
  mount --bind "/host-tmp/${kept#/tmp/}" "$kept"
done
mount -t tmpfs tmpfs /run
ln -sf /proc/self/fd /dev/fd
ip link set lo up
hostname numa-e2e-guest
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
{
  echo "guest: $(uname -r), $(nproc) CPUs, NUMA nodes: $(cat /sys/devices/system/node/online)"
  for node in /sys/devices/system/node/node[0-9]*; do
    echo "guest: ${node##*/} cpulist=$(cat "$node/cpulist") distance=$(cat "$node/distance")" \
      "sockets=$(cat "$node"/cpu[0-9]*/topology/physical_package_id 2>/dev/null | sort -u | xargs)"
  done
  cd "$(dirname "$cluster")/../.." && "$python" -u "$cluster" guest "$results"
  echo $? >"$results/exit-code"
} >/dev/ttyS1 2>&1
sync
echo o >/proc/sysrq-trigger
sleep 60
