"""Tests of probes, signals, limits, the instance lock, heap trimming, scrape floods."""
