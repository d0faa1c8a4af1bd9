#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Create the KVM test cluster: a registry VM, an RKE2 server and RKE2 workers
# whose guests have NUMA nodes, with kubelets set up for NUMA alignment.
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
  sed -n '3,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

ensure_secrets() {
  mkdir -p "${STATE_DIR}" "${STATE_DIR}/disks" "${STATE_DIR}/images"
  [[ -f "${STATE_DIR}/id_ed25519" ]] || ssh-keygen -q -t ed25519 -N "" -f "${STATE_DIR}/id_ed25519"
  [[ -f "${STATE_DIR}/token" ]] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"${STATE_DIR}/token"
}

ensure_network() {
  if virsh_ net-info "${NETWORK_NAME}" >/dev/null 2>&1; then
    log "network ${NETWORK_NAME} exists"
  else
    log "defining network ${NETWORK_NAME}"
    virsh_ net-define "${STATE_DIR}/render/network.xml"
  fi
  virsh_ net-autostart "${NETWORK_NAME}" >/dev/null
  if ! virsh_ net-info "${NETWORK_NAME}" | grep -q '^Active:.*yes'; then
    virsh_ net-start "${NETWORK_NAME}"
  fi
}

ensure_base_image() {
  BASE_IMAGE="${STATE_DIR}/images/$(basename "${IMAGE_URL}")"
  if [[ ! -f "${BASE_IMAGE}" ]]; then
    log "downloading ${IMAGE_URL}"
    curl -fL --retry 3 -o "${BASE_IMAGE}.part" "${IMAGE_URL}"
    mv "${BASE_IMAGE}.part" "${BASE_IMAGE}"
  fi
}

make_seed() {
  local vm="$1" dir="${STATE_DIR}/render/$1" seed="${STATE_DIR}/disks/$1-seed.iso"
  if command -v cloud-localds >/dev/null; then
    cloud-localds "${seed}" "${dir}/user-data" "${dir}/meta-data"
  else
    genisoimage -quiet -output "${seed}" -volid cidata -joliet -rock "${dir}/user-data" "${dir}/meta-data"
  fi
}

ensure_vm() {
  local vm="$1" disk="${STATE_DIR}/disks/$1.qcow2"
  if vm_exists "${vm}"; then
    log "VM ${vm} exists"
    return
  fi
  log "creating VM ${vm}"
  [[ -f "${disk}" ]] || qemu-img create -q -f qcow2 -F qcow2 -b "${BASE_IMAGE}" "${disk}" "${DISK_GIB}G"
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
  ensure_network
  ensure_base_image
  local vm
  while read -r vm; do
    ensure_vm "${vm}"
  done < <(vm_names)
  fetch_kubeconfig
}

main "$@"
