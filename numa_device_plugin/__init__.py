"""numa-device-plugin: a kubelet device plugin advertising one extended resource per NUMA node."""

__version__ = "0.1.0"
