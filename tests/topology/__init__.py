"""Tests of sysfs, the NUMA nodes and their memory pools (numa_device_plugin.topology)."""
