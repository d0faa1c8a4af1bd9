"""Tests of per-node configuration and its supervisor."""
