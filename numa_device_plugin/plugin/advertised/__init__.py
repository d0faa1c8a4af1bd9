"""What the plugin advertises: one look at sysfs (:mod:`.discovery`) planned into
resources (:mod:`.build`): a resource per NUMA node, its memory resources, and the
resources that follow a device with their memory (:mod:`.devicememory`); and what a
resource whose device is gone keeps telling the kubelet (:mod:`.lost`). Pure but for
discovery's sysfs reads. It may import :mod:`..model` and :mod:`..settings`.
"""
