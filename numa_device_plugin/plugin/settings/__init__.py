"""The plugin's settings: the frozen :class:`~.config.Config` the command line builds
once and every part only reads, and the command line's value conversions
(:mod:`.values`, shared with the per-node configuration file). It may import
:mod:`..model`.
"""
