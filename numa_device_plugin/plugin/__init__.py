"""The device plugin, in sub-packages by job. Each imports only itself and those listed
before it (``tests/test_structure.py`` holds the order), so data flows one way, from
sysfs to the kubelet's registration:

- :mod:`.model`: the plain data every job shares (resources and their devices, names,
  ids, the ``--near`` entry, the figures and the recorder protocol);
- :mod:`.settings`: the frozen configuration and the command line's values;
- :mod:`.advertised`: what is advertised: one look at sysfs planned into resources;
- :mod:`.serving`: serving the kubelet: servicers, endpoints, the catalog, the lock;
- :mod:`.counts`: live counts from the kubelet's pod resources API;
- :mod:`.reports`: what the plugin reports: metrics, its state, ``status``, the node page;
- :mod:`.lifecycle`: when to serve again: the manager, its watches and verdicts.
"""
