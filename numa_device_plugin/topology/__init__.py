"""sysfs -> NUMA nodes: reading sysfs (``sysfs``), the NUMA nodes and which are
advertised (``numa``), their memory pools (``memory``), synthetic trees (``fake``).
Imports no other layer.
"""
