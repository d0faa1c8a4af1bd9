"""When to serve again: the :class:`~.manager.PluginManager`'s single restart loop,
what wakes it (:mod:`.watches`, the :mod:`.devicewatch`), what it serves again
(:mod:`.restarts`) and its pure verdicts (:mod:`.verdicts`). The top of the plugin: it
may import every other sub-package.
"""
