"""Tests of what is shipped: manifests, the chart, alerts, dashboard, image, harnesses."""
