"""The kubelet's side: the gRPC server on a unix socket (``grpcserver``), Register
(``registration``), the ``kubelet.sock`` watcher (``watcher``), the pod resources API
client (``podresources``) and what it says (``view``). Imports only ``topology``.
"""
