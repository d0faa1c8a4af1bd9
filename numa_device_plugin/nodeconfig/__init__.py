"""Per-node configuration: the file of named configurations (``configs``), the
node's labels from the API server (``labels``, ``apiclient``)
and the supervisor that serves the chosen one (``supervisor``).
"""
