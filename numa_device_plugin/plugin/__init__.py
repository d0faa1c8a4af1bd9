"""The device plugin: devices and their live counts, the servicer, the catalog,
endpoints, the poller, the manager, its recorders, its state (``snapshot``,
``status``, ``nodepage``) and its settings (``config``, ``values``).
"""
