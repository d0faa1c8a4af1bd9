"""Live counts: the kubelet's pod resources API read by the :mod:`.poller` when the
:mod:`.schedule` says, turned (:mod:`.planning`) into each resource's device list and
health (:mod:`.capacity`, from the ids containers hold: :mod:`.held`). It only feeds
the servicers. It may import :mod:`..model`, :mod:`..settings`, :mod:`..advertised` and
:mod:`..serving`.
"""
