#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Remove everything test/infra/create-cluster.sh made: its VMs (names starting
# with CLUSTER_NAME-), its storage pool with every volume in it (disks, seeds,
# the cloud image), its libvirt network and its state folder (keys, token,
# kubeconfig, downloaded image). Nothing else is touched.
#
# Usage: test/infra/destroy-cluster.sh
set -euo pipefail

INFRA_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "${INFRA_DIR}/lib.sh"

main() {
  if (($#)); then
    sed -n '3,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
  fi
  load_config
  command -v virsh >/dev/null || die "virsh is not installed"
  local vm volume
  while read -r vm; do
    [[ "${vm}" == "${CLUSTER_NAME}-"* ]] || continue
    log "removing VM ${vm}"
    virsh_ destroy "${vm}" >/dev/null 2>&1 || true
    virsh_ undefine "${vm}" --nvram >/dev/null 2>&1 || virsh_ undefine "${vm}" >/dev/null
  done < <(virsh_ list --all --name)
  if virsh_ pool-info "${POOL_NAME}" >/dev/null 2>&1; then
    log "removing storage pool ${POOL_NAME} (${DISK_DIR}) and its volumes"
    virsh_ pool-start "${POOL_NAME}" >/dev/null 2>&1 || true
    while read -r volume; do
      [[ -n "${volume}" ]] && virsh_ vol-delete --pool "${POOL_NAME}" "${volume}" >/dev/null
    done < <(virsh_ vol-list --pool "${POOL_NAME}" --name)
    virsh_ pool-destroy "${POOL_NAME}" >/dev/null 2>&1 || true
    virsh_ pool-delete "${POOL_NAME}" >/dev/null 2>&1 || true
    virsh_ pool-undefine "${POOL_NAME}" >/dev/null
  fi
  if virsh_ net-info "${NETWORK_NAME}" >/dev/null 2>&1; then
    log "removing network ${NETWORK_NAME}"
    virsh_ net-destroy "${NETWORK_NAME}" >/dev/null 2>&1 || true
    virsh_ net-undefine "${NETWORK_NAME}" >/dev/null
  fi
  if [[ -d "${STATE_DIR}" ]]; then
    log "removing ${STATE_DIR}"
    rm -rf "${STATE_DIR}"
  fi
}

main "$@"
