"""The plugin's image for the image modes (PLUGIN=kustomize|helm): built and pushed into
the local registry's storage before the cluster starts, or made by ``make release``
(RELEASE=1), each in a private namespace with the host checked afterwards.
"""

from __future__ import annotations

import shipped
from kubecluster import host_kept, in_namespace
from plan import CACHE, Spec, log
from results import report


def prepare_image(spec: Spec) -> int:
    """Image modes, on the host before the cluster: ``make image`` (buildah, over the
    Python stand-in) in a private mount namespace, then ``make push`` into the registry's
    storage in a private network namespace too; the host is checked afterwards. Returns
    0, or the failing step's status."""
    shipped.python_standin(CACHE)
    with host_kept(spec.path) as differs:
        if spec.release:
            shipped.python_standin(CACHE, "arm64")
            status = in_namespace(spec, "release", spec.work, spec.helm, network=False)
        else:
            status = in_namespace(spec, "build", spec.work, network=False)
            if status == 0:
                status = in_namespace(spec, "push", spec.work, network=True)
    if status:
        log(f"the image was not built and pushed (status {status})")
    return report(status, differs)
