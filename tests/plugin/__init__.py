"""Tests of the device plugin: devices, servicer, manager, capacity, status, the node page."""
