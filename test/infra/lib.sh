# shellcheck shell=bash
# shellcheck source-path=SCRIPTDIR
# Shared by create-cluster.sh and destroy-cluster.sh: configuration, naming,
# rendering of cloud-init and VM definitions, and the libvirt operations.
# Rendering writes files only; nothing here touches libvirt unless called by name.

load_config() {
  # shellcheck source=config.env
  source "${INFRA_DIR}/config.env"
  if [[ -f "${INFRA_DIR}/config.local.env" ]]; then
    # shellcheck source=/dev/null
    source "${INFRA_DIR}/config.local.env"
  fi
  WORKER_CPUS=$((NUMA_NODES_PER_WORKER * CPUS_PER_NUMA_NODE))
  WORKER_MEMORY_MIB=$((NUMA_NODES_PER_WORKER * MEMORY_MIB_PER_NUMA_NODE))
  RESERVED_TOTAL_MIB=$((KUBE_RESERVED_MEMORY_MIB + SYSTEM_RESERVED_MEMORY_MIB + EVICTION_HARD_MEMORY_MIB))
  if ((RESERVED_TOTAL_MIB % NUMA_NODES_PER_WORKER != 0)); then
    die "kube + system reserved + eviction memory (${RESERVED_TOTAL_MIB} MiB) must split evenly over ${NUMA_NODES_PER_WORKER} NUMA nodes"
  fi
  RESERVED_PER_NODE_MIB=$((RESERVED_TOTAL_MIB / NUMA_NODES_PER_WORKER))
  local cpu node
  RESERVED_CPU_IDS="$(expand_cpulist "${RESERVED_CPUS}")" || die "RESERVED_CPUS=${RESERVED_CPUS} is not a cpulist like 0 or 0,4 or 0-1"
  for cpu in ${RESERVED_CPU_IDS}; do
    ((cpu < WORKER_CPUS)) || die "RESERVED_CPUS=${RESERVED_CPUS}: CPU ${cpu} is not one of the workers' ${WORKER_CPUS} vCPUs"
  done
  for ((node = 0; node < NUMA_NODES_PER_WORKER; node++)); do
    (($(exclusive_cpus "${node}") > 0)) || die "RESERVED_CPUS=${RESERVED_CPUS} leaves NUMA node ${node} no exclusive CPU"
  done
}

# The CPU ids of a cpulist ("0,4-5" -> "0 4 5"), ascending and space-separated;
# exit 1 when malformed.
expand_cpulist() {
  local part first last cpu ids=() parts=()
  IFS=, read -r -a parts <<<"$1"
  for part in "${parts[@]}"; do
    if [[ "${part}" =~ ^([0-9]+)-([0-9]+)$ ]]; then
      first="${BASH_REMATCH[1]}" last="${BASH_REMATCH[2]}"
      ((first <= last)) || return 1
    elif [[ "${part}" =~ ^[0-9]+$ ]]; then
      first="${part}" last="${part}"
    else
      return 1
    fi
    for ((cpu = first; cpu <= last; cpu++)); do ids+=("${cpu}"); done
  done
  ((${#ids[@]})) || return 0
  printf '%s\n' "${ids[@]}" | sort -nu | paste -sd' ' -
}

# Exclusive CPUs a worker's NUMA node N offers pods: its vCPUs minus the reserved ones.
exclusive_cpus() {
  local node="$1" first last cpu count
  first=$((node * CPUS_PER_NUMA_NODE))
  last=$((first + CPUS_PER_NUMA_NODE - 1))
  count="${CPUS_PER_NUMA_NODE}"
  for cpu in ${RESERVED_CPU_IDS}; do
    if ((cpu >= first && cpu <= last)); then
      count=$((count - 1))
    fi
  done
  echo "${count}"
}

die() {
  echo "error: $*" >&2
  exit 1
}

log() {
  echo "==> $*" >&2
}

# VM names, one per line: registry, server, workers.
vm_names() {
  echo "${CLUSTER_NAME}-registry"
  echo "${CLUSTER_NAME}-server"
  local i
  for ((i = 1; i <= WORKERS; i++)); do
    echo "${CLUSTER_NAME}-worker-${i}"
  done
}

vm_role() {
  case "$1" in
    *-registry) echo registry ;;
    *-server) echo server ;;
    *) echo worker ;;
  esac
}

vm_ip() {
  case "$1" in
    *-registry) echo "${REGISTRY_IP}" ;;
    *-server) echo "${SERVER_IP}" ;;
    *) echo "${NETWORK_PREFIX}.$((WORKER_IP_BASE + ${1##*-}))" ;;
  esac
}

vm_mac() {
  local last="${1##*.}"
  printf '52:54:00:96:00:%02x\n' "${last}"
}

vm_cpus() {
  case "$(vm_role "$1")" in
    registry) echo "${REGISTRY_CPUS}" ;;
    server) echo "${SERVER_CPUS}" ;;
    worker) echo "${WORKER_CPUS}" ;;
  esac
}

vm_memory_mib() {
  case "$(vm_role "$1")" in
    registry) echo "${REGISTRY_MEMORY_MIB}" ;;
    server) echo "${SERVER_MEMORY_MIB}" ;;
    worker) echo "${WORKER_MEMORY_MIB}" ;;
  esac
}

# virt-install's --cpu value: guest NUMA cells for workers (memory in KiB).
vm_cpu_option() {
  local vm="$1" option="host-passthrough" cell first last
  if [[ "$(vm_role "${vm}")" == worker ]]; then
    for ((cell = 0; cell < NUMA_NODES_PER_WORKER; cell++)); do
      first=$((cell * CPUS_PER_NUMA_NODE))
      last=$((first + CPUS_PER_NUMA_NODE - 1))
      option+=",cell${cell}.id=${cell},cell${cell}.cpus=${first}-${last}"
      option+=",cell${cell}.memory=$((MEMORY_MIB_PER_NUMA_NODE * 1024))"
    done
  fi
  echo "${option}"
}

# virt-install's --vcpus value: workers get one socket per NUMA cell, so the guest's
# sockets, cores and NUMA nodes agree (CPUs 0-3 socket 0 and cell 0, and so on).
vm_vcpus_option() {
  local vm="$1"
  if [[ "$(vm_role "${vm}")" == worker ]]; then
    echo "${WORKER_CPUS},sockets=${NUMA_NODES_PER_WORKER},cores=${CPUS_PER_NUMA_NODE},threads=1"
  else
    vm_cpus "${vm}"
  fi
}

# The storage pool's volume holding the cloud image (the image's file name).
base_volume() {
  basename "${IMAGE_URL}"
}

# virt-install arguments, one per line.
render_virt_install_args() {
  local vm="$1" ip
  ip="$(vm_ip "${vm}")"
  cat <<EOF
--connect=${LIBVIRT_URI}
--name=${vm}
--memory=$(vm_memory_mib "${vm}")
--vcpus=$(vm_vcpus_option "${vm}")
--cpu=$(vm_cpu_option "${vm}")
--osinfo=${OSINFO}
--disk=vol=${POOL_NAME}/${vm}.qcow2,bus=virtio
--disk=vol=${POOL_NAME}/${vm}-seed.iso,device=cdrom
--network=network=${NETWORK_NAME},mac=$(vm_mac "${ip}")
--import
--noautoconsole
--graphics=none
EOF
}

render_pool_xml() {
  cat <<EOF
<pool type='dir'>
  <name>${POOL_NAME}</name>
  <target>
    <path>${DISK_DIR}</path>
  </target>
</pool>
EOF
}

render_network_xml() {
  local vm ip
  cat <<EOF
<network>
  <name>${NETWORK_NAME}</name>
  <forward mode='nat'/>
  <ip address='${NETWORK_PREFIX}.1' netmask='255.255.255.0'>
    <dhcp>
      <range start='${NETWORK_PREFIX}.100' end='${NETWORK_PREFIX}.200'/>
EOF
  while read -r vm; do
    ip="$(vm_ip "${vm}")"
    echo "      <host mac='$(vm_mac "${ip}")' name='${vm}' ip='${ip}'/>"
  done < <(vm_names)
  cat <<EOF
    </dhcp>
  </ip>
</network>
EOF
}

render_registries_yaml() {
  cat <<EOF
      mirrors:
        "${REGISTRY_NAME}:${REGISTRY_PORT}":
          endpoint:
            - "http://${REGISTRY_IP}:${REGISTRY_PORT}"
EOF
}

# The kubelet arguments of a worker, one per line (RKE2 kubelet-arg entries).
worker_kubelet_args() {
  local node
  echo "cpu-manager-policy=static"
  echo "topology-manager-policy=single-numa-node"
  echo "topology-manager-scope=pod"
  echo "memory-manager-policy=Static"
  echo "reserved-cpus=${RESERVED_CPUS}"
  echo "kube-reserved=memory=${KUBE_RESERVED_MEMORY_MIB}Mi"
  echo "system-reserved=memory=${SYSTEM_RESERVED_MEMORY_MIB}Mi"
  echo "eviction-hard=memory.available<${EVICTION_HARD_MEMORY_MIB}Mi"
  for ((node = 0; node < NUMA_NODES_PER_WORKER; node++)); do
    echo "reserved-memory=${node}:memory=${RESERVED_PER_NODE_MIB}Mi"
  done
}

render_user_data() {
  local vm="$1" public_key="$2" token="$3" role arg
  role="$(vm_role "${vm}")"
  cat <<EOF
#cloud-config
hostname: ${vm}
users:
  - name: ubuntu
    sudo: "ALL=(ALL) NOPASSWD:ALL"
    shell: /bin/bash
    ssh_authorized_keys:
      - "${public_key}"
EOF
  if [[ "${role}" == registry ]]; then
    cat <<EOF
packages:
  - docker.io
runcmd:
  - [systemctl, enable, --now, docker]
  - [docker, run, -d, --restart=always, -p, "${REGISTRY_PORT}:5000", --name, registry, "registry:2"]
EOF
    return
  fi
  cat <<EOF
write_files:
  - path: /etc/rancher/rke2/registries.yaml
    permissions: "0644"
    content: |
$(render_registries_yaml)
  - path: /etc/rancher/rke2/config.yaml
    permissions: "0600"
    content: |
      token: "${token}"
      node-name: ${vm}
EOF
  if [[ "${role}" == server ]]; then
    cat <<EOF
      tls-san:
        - ${SERVER_IP}
      write-kubeconfig-mode: "0644"
EOF
  else
    echo "      server: https://${SERVER_IP}:9345"
    echo "      kubelet-arg:"
    while read -r arg; do
      echo "        - \"${arg}\""
    done < <(worker_kubelet_args)
  fi
  local install_type=server service=rke2-server.service
  if [[ "${role}" == worker ]]; then
    install_type=agent
    service=rke2-agent.service
  fi
  cat <<EOF
runcmd:
  - "grep -q ' ${REGISTRY_NAME}\$' /etc/hosts || echo '${REGISTRY_IP} ${REGISTRY_NAME}' >> /etc/hosts"
  - "curl -sfL https://get.rke2.io | INSTALL_RKE2_TYPE=${install_type} INSTALL_RKE2_VERSION=${RKE2_VERSION} sh -"
  - [systemctl, enable, --now, ${service}]
EOF
}

render_meta_data() {
  printf 'instance-id: %s\nlocal-hostname: %s\n' "$1" "$1"
}

# Memory (MiB) and disk (GiB) all VMs need together: "MIB GIB".
plan_totals() {
  local vm total_mib=0 total_gib=0
  while read -r vm; do
    total_mib=$((total_mib + $(vm_memory_mib "${vm}")))
    total_gib=$((total_gib + DISK_GIB))
  done < <(vm_names)
  echo "${total_mib} ${total_gib}"
}

render_plan() {
  local vm total_mib total_gib node exclusive=""
  echo "cluster ${CLUSTER_NAME} on ${LIBVIRT_URI}, network ${NETWORK_NAME} (${NETWORK_PREFIX}.0/24)"
  echo "storage pool ${POOL_NAME} at ${DISK_DIR}"
  echo "image ${IMAGE_URL}, checked against ${IMAGE_SHA256:-${IMAGE_SHA256SUMS_URL}}; RKE2 ${RKE2_VERSION}"
  while read -r vm; do
    echo "create VM ${vm}: role $(vm_role "${vm}"), $(vm_cpus "${vm}") vCPUs, $(vm_memory_mib "${vm}") MiB, ${DISK_GIB} GiB disk, ip $(vm_ip "${vm}"), cpu $(vm_cpu_option "${vm}")"
  done < <(vm_names)
  read -r total_mib total_gib < <(plan_totals)
  echo "workers: kubelet $(worker_kubelet_args | paste -sd' ' -)"
  for ((node = 0; node < NUMA_NODES_PER_WORKER; node++)); do
    exclusive+="${exclusive:+, }NUMA node ${node}: $(exclusive_cpus "${node}")"
  done
  echo "exclusive CPUs on each worker: ${exclusive}"
  echo "needs ${total_mib} MiB of memory and ${total_gib} GiB of disk"
  echo "writes kubeconfig ${STATE_DIR}/kubeconfig"
}

# Render everything for every VM into DIR: plan.txt, network.xml, pool.xml, VM/user-data,
# VM/meta-data, VM/virt-install.args.
render_all() {
  local out="$1" public_key="$2" token="$3" vm
  mkdir -p "${out}"
  render_plan >"${out}/plan.txt"
  render_network_xml >"${out}/network.xml"
  render_pool_xml >"${out}/pool.xml"
  while read -r vm; do
    mkdir -p "${out}/${vm}"
    render_user_data "${vm}" "${public_key}" "${token}" >"${out}/${vm}/user-data"
    render_meta_data "${vm}" >"${out}/${vm}/meta-data"
    render_virt_install_args "${vm}" >"${out}/${vm}/virt-install.args"
  done < <(vm_names)
}

check_prerequisites() {
  local missing=() tool need_mib need_gib free_mib free_gib
  [[ -c "${KVM_DEVICE}" && -w "${KVM_DEVICE}" ]] || missing+=("${KVM_DEVICE} (KVM not available or not writable: enable virtualization, add yourself to the kvm group)")
  for tool in virsh:libvirt-clients virt-install:virtinst curl:curl sha256sum:coreutils ssh:openssh-client ssh-keygen:openssh-client; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool%%:*} (Debian/Ubuntu package ${tool#*:})")
  done
  command -v kubectl >/dev/null || missing+=("kubectl (https://kubernetes.io/docs/tasks/tools/)")
  if ! command -v cloud-localds >/dev/null && ! command -v genisoimage >/dev/null; then
    missing+=("cloud-localds or genisoimage (install cloud-image-utils or genisoimage)")
  fi
  if command -v virsh >/dev/null && ! virsh --connect "${LIBVIRT_URI}" version >/dev/null 2>&1; then
    missing+=("libvirt at ${LIBVIRT_URI} (is libvirtd running, and may you use it?)")
  fi
  read -r need_mib need_gib < <(plan_totals)
  free_mib=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) / 1024))
  # Overlay disks grow as the guests write; the pool's folder may not exist yet.
  local where="${DISK_DIR}"
  while [[ ! -d "${where}" ]]; do where="$(dirname "${where}")"; done
  free_gib=$(($(df --output=avail -k "${where}" | tail -1) / 1024 / 1024))
  ((free_mib >= need_mib)) || missing+=("memory: the VMs need ${need_mib} MiB, ${free_mib} MiB available")
  ((free_gib >= need_gib)) || missing+=("disk: the VMs need up to ${need_gib} GiB in ${DISK_DIR}, ${free_gib} GiB free")
  if ((${#missing[@]})); then
    printf 'missing prerequisite: %s\n' "${missing[@]}" >&2
    exit 1
  fi
}

virsh_() {
  virsh --connect "${LIBVIRT_URI}" "$@"
}

vm_exists() {
  virsh_ dominfo "$1" >/dev/null 2>&1
}

# The SHA-256 a SHA256SUMS text (stdin) gives for file NAME; empty when it lists none.
sha256_from_sums() {
  awk -v name="$1" '$2 == name || $2 == "*" name { print $1; exit }'
}

# Exit 1 (naming the file and both sums) unless FILE's SHA-256 is EXPECTED.
check_sha256() {
  local file="$1" expected="$2" actual
  actual="$(sha256sum "${file}" | cut -d' ' -f1)"
  [[ "${actual}" == "${expected}" ]] || die "${file}: SHA-256 ${actual}, expected ${expected}"
}

# The cloud image's expected SHA-256: IMAGE_SHA256, else its line in IMAGE_SHA256SUMS_URL.
expected_image_sha256() {
  local sums expected
  if [[ -n "${IMAGE_SHA256}" ]]; then
    echo "${IMAGE_SHA256}"
    return
  fi
  sums="$(curl -fsSL --retry 3 "${IMAGE_SHA256SUMS_URL}")" || die "cannot download ${IMAGE_SHA256SUMS_URL}"
  expected="$(sha256_from_sums "$(base_volume)" <<<"${sums}")"
  [[ -n "${expected}" ]] || die "${IMAGE_SHA256SUMS_URL} lists no $(base_volume)"
  echo "${expected}"
}
