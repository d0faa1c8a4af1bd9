"""The plain data every job of the plugin shares, and nothing that acts on it: an
extended resource and its devices (:mod:`.resources`), the rules for resource names
(:mod:`.names`), device ids and socket names (:mod:`.ids`), the ``--near`` entry of a
resource that follows a device (:mod:`.near`), the per-NUMA-node figures the counts
hand to the reports (:mod:`.figures`) and the :class:`~.recorder.Recorder` protocol the
servicer, the poller and the manager report to. It imports only the layers below the
plugin (topology, kubelet, ops, api); every other sub-package may import it.
"""
