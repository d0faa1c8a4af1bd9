"""What the plugin reports: Prometheus metrics (:mod:`.prometheus`, made after
registering by :mod:`.deferred`), one moment of its state as plain data
(:mod:`.snapshot`, for ``/debug/state``) and as a page (:mod:`.nodepage`), and the
``status`` command (:mod:`.status`). Nothing here decides what is served. It may import
every sub-package but :mod:`..lifecycle`.
"""
