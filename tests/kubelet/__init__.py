"""Tests of the kubelet's side: the gRPC server, the stubs, the kubelet stand-in."""
