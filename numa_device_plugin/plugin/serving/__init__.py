"""Serving the kubelet: one v1beta1 ``DevicePlugin`` servicer per resource
(:mod:`.servicer`, whose requests are checked and answered purely by :mod:`.requests`),
kept by the :mod:`.catalog`; per resource a gRPC server on its
socket and its registration (:mod:`.endpoint`); and the instance lock without which
nothing is served (:mod:`.lock`). It may import :mod:`..model`, :mod:`..settings` and
:mod:`..advertised`.
"""
