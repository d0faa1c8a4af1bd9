#!/usr/bin/env bash
# After the plugin is uninstalled: remove its resources (PREFIX/*, default numa-align)
# from every node's status. The kubelet keeps a device plugin's resource in node status
# at capacity 0 for ever once the plugin is gone (so that the scheduler knows it was
# one), and for 5 minutes after the plugin stopped it still counts the devices (its
# endpoint's grace period): entries not yet at 0 are left alone and named; run this
# again later. Usage: clear-capacity.sh [PREFIX]; needs kubectl >= 1.24 (--subresource)
# and permission to patch nodes/status. Exit 0 when nothing of PREFIX is left, 1 when
# some entries must wait, 2 for a bad argument.
set -euo pipefail

prefix="${1:-numa-align}"
if [[ $# -gt 1 || ! "$prefix" =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]]; then
  echo "usage: $0 [PREFIX]   (a resource prefix such as numa-align)" >&2
  exit 2
fi

waiting=0
# shellcheck disable=SC2016  # a go-template for kubectl, not a shell expansion
entries="$(kubectl get nodes -o go-template='{{range .items}}{{$node := .metadata.name}}{{range $name, $value := .status.capacity}}{{$node}} {{$name}} {{$value}}{{"\n"}}{{end}}{{end}}')"
while read -r node name value; do
  [[ "$name" == "$prefix/"* ]] || continue
  if [[ "$value" != 0 ]]; then
    echo "$node: $name is still $value (the kubelet counts a stopped plugin's devices for 5 minutes): run this again later"
    waiting=1
    continue
  fi
  key="${name//\//"~1"}"  # JSON Pointer: "/" in a key is written ~1 (quoted: no tilde expansion)
  kubectl patch node "$node" --subresource=status --type=json \
    -p "[{\"op\": \"remove\", \"path\": \"/status/capacity/$key\"}]" >/dev/null
  # Allocatable follows capacity at the kubelet's next status update; removed now too
  # where it is listed (a node without a kubelet keeps it otherwise).
  kubectl patch node "$node" --subresource=status --type=json \
    -p "[{\"op\": \"remove\", \"path\": \"/status/allocatable/$key\"}]" >/dev/null 2>&1 || true
  echo "$node: $name removed"
done <<<"$entries"
exit "$waiting"
