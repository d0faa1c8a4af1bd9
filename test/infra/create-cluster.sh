#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Create the KVM test cluster: a registry VM, an RKE2 server and RKE2 workers
# whose guests have NUMA nodes, with kubelets set up for NUMA alignment. Returns
# when every node is Ready and the registry answers.
#
# Usage: test/infra/create-cluster.sh [--dry-run [DIR]]
#   --dry-run [DIR]  render cloud-init, VM definitions and the plan into DIR
#                    (default test/infra/.render) and touch nothing else.
# Sizes, versions and addresses: test/infra/config.env. Running it twice does
# not duplicate anything; test/infra/destroy-cluster.sh removes it all.
set -euo pipefail

INFRA_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "${INFRA_DIR}/lib.sh"

usage() {
  sed -n '3,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

ensure_secrets() {
  mkdir -p "${STATE_DIR}" "${STATE_DIR}/images" "${STATE_DIR}/seeds"
  [[ -f "${STATE_DIR}/id_ed25519" ]] || ssh-keygen -q -t ed25519 -N "" -f "${STATE_DIR}/id_ed25519"
  [[ -f "${STATE_DIR}/token" ]] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"${STATE_DIR}/token"
}

# Define (from the rendered FILE), autostart and start the libvirt KIND (net or pool)
# NAME; RUNNING is what `virsh KIND-info` prints once it runs.
ensure_started() {
  local kind="$1" name="$2" file="$3" running="$4"
  if virsh_ "${kind}-info" "${name}" >/dev/null 2>&1; then
    log "${kind} ${name} exists"
  else
    log "defining ${kind} ${name}"
    virsh_ "${kind}-define" "${STATE_DIR}/render/${file}"
    if [[ "${kind}" == pool ]]; then
      virsh_ pool-build "${name}" # libvirtd makes the folder, so its qemu can read it
    fi
  fi
  virsh_ "${kind}-autostart" "${name}" >/dev/null
  if ! virsh_ "${kind}-info" "${name}" | grep -q "${running}"; then
    virsh_ "${kind}-start" "${name}"
  fi
}

volume_exists() {
  virsh_ vol-info --pool "${POOL_NAME}" "$1" >/dev/null 2>&1
}

# Copy FILE into the pool as volume NAME (replacing one of that name).
upload_volume() {
  local name="$1" file="$2"
  if volume_exists "${name}"; then
    virsh_ vol-delete --pool "${POOL_NAME}" "${name}" >/dev/null
  fi
  virsh_ vol-create-as "${POOL_NAME}" "${name}" "$(stat -c %s "${file}")" --format raw >/dev/null
  virsh_ vol-upload --pool "${POOL_NAME}" "${name}" "${file}"
}

# The cloud image, downloaded once, its SHA-256 checked, then copied into the pool.
ensure_base_image() {
  local image expected
  image="${STATE_DIR}/images/$(base_volume)"
  if volume_exists "$(base_volume)"; then
    log "volume $(base_volume) exists"
    return
  fi
  expected="$(expected_image_sha256)"
  if [[ ! -f "${image}" ]]; then
    log "downloading ${IMAGE_URL}"
    curl -fL --retry 3 -o "${image}.part" "${IMAGE_URL}"
    if ! (check_sha256 "${image}.part" "${expected}"); then
      rm -f "${image}.part"
      die "the download of ${IMAGE_URL} does not match its checksum; removed it"
    fi
    mv "${image}.part" "${image}"
  fi
  (check_sha256 "${image}" "${expected}") || die "remove ${image} and run again"
  log "copying $(base_volume) into storage pool ${POOL_NAME}"
  upload_volume "$(base_volume)" "${image}"
  virsh_ pool-refresh "${POOL_NAME}" >/dev/null
}

make_seed() {
  local vm="$1" dir="${STATE_DIR}/render/$1" seed="${STATE_DIR}/seeds/$1-seed.iso"
  if command -v cloud-localds >/dev/null; then
    cloud-localds "${seed}" "${dir}/user-data" "${dir}/meta-data"
  else
    genisoimage -quiet -output "${seed}" -volid cidata -joliet -rock "${dir}/user-data" "${dir}/meta-data"
  fi
  upload_volume "${vm}-seed.iso" "${seed}"
}

ensure_vm() {
  local vm="$1"
  if vm_exists "${vm}"; then
    log "VM ${vm} exists"
    return
  fi
  log "creating VM ${vm}"
  if ! volume_exists "${vm}.qcow2"; then
    virsh_ vol-create-as "${POOL_NAME}" "${vm}.qcow2" "${DISK_GIB}G" --format qcow2 \
      --backing-vol "$(base_volume)" --backing-vol-format qcow2 >/dev/null
  fi
  make_seed "${vm}"
  local args=()
  mapfile -t args <"${STATE_DIR}/render/${vm}/virt-install.args"
  virt-install "${args[@]}"
}

fetch_kubeconfig() {
  local ssh=(ssh -i "${STATE_DIR}/id_ed25519" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=5 "ubuntu@${SERVER_IP}")
  local attempt
  log "waiting for the RKE2 server at ${SERVER_IP} (up to 15 minutes)"
  for ((attempt = 0; attempt < 90; attempt++)); do
    if "${ssh[@]}" test -f /etc/rancher/rke2/rke2.yaml 2>/dev/null; then
      "${ssh[@]}" cat /etc/rancher/rke2/rke2.yaml | sed "s#https://127.0.0.1:6443#https://${SERVER_IP}:6443#" >"${STATE_DIR}/kubeconfig"
      chmod 600 "${STATE_DIR}/kubeconfig"
      log "kubeconfig written: export KUBECONFIG=${STATE_DIR}/kubeconfig"
      return
    fi
    sleep 10
  done
  die "the RKE2 server did not come up; look at: virsh console ${CLUSTER_NAME}-server"
}

# Return once every node is Ready and the registry answers; exit 1 naming what is not.
wait_for_cluster() {
  local kubectl=(kubectl --kubeconfig "${STATE_DIR}/kubeconfig" --request-timeout=10s)
  local want=$((1 + WORKERS)) ready=0 attempt
  log "waiting for ${want} nodes to be Ready (up to 20 minutes)"
  for ((attempt = 0; attempt < 120; attempt++)); do
    ready="$("${kubectl[@]}" get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)"
    ((ready >= want)) && break
    sleep 10
  done
  ((ready >= want)) || die "${ready} of ${want} nodes are Ready after 20 minutes; look at: kubectl get nodes"
  local url="http://${REGISTRY_IP}:${REGISTRY_PORT}/v2/"
  log "waiting for the registry at ${url} (up to 5 minutes)"
  for ((attempt = 0; attempt < 60; attempt++)); do
    if curl -fsS -o /dev/null --max-time 5 "${url}"; then
      log "cluster ready: ${want} nodes Ready, registry answering"
      return
    fi
    sleep 5
  done
  die "the registry at ${url} does not answer; look at: virsh console ${CLUSTER_NAME}-registry"
}

main() {
  local dry_run="" out=""
  while (($#)); do
    case "$1" in
      --dry-run)
        dry_run=1
        if [[ $# -gt 1 && "$2" != -* ]]; then
          out="$2"
          shift
        fi
        ;;
      -h | --help)
        usage
        exit 0
        ;;
      *)
        usage >&2
        exit 2
        ;;
    esac
    shift
  done
  load_config
  if [[ -n "${dry_run}" ]]; then
    out="${out:-${INFRA_DIR}/.render}"
    render_all "${out}" "ssh-ed25519 AAAA-dry-run-key dry-run" "dry-run-token"
    cat "${out}/plan.txt"
    log "rendered into ${out}; nothing else was touched"
    return
  fi
  check_prerequisites
  ensure_secrets
  render_all "${STATE_DIR}/render" "$(cat "${STATE_DIR}/id_ed25519.pub")" "$(cat "${STATE_DIR}/token")"
  ensure_started net "${NETWORK_NAME}" network.xml '^Active:.*yes'
  ensure_started pool "${POOL_NAME}" pool.xml '^State:.*running'
  ensure_base_image
  local vm
  while read -r vm; do
    ensure_vm "${vm}"
  done < <(vm_names)
  fetch_kubeconfig
  wait_for_cluster
}

main "$@"
