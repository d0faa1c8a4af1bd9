"""The cluster as ``top`` (``kubectl numa``) sees it, below the CLI: the API server read
through the ``kubernetes`` client with a total deadline and byte caps (``kubeapi``),
a kubeconfig's exec credential plugin run bounded (``execcredential``) and the
scheduler's arithmetic over Nodes and Pods (``fit``). Imported only by ``top``: the
daemon never loads the ``kubernetes`` package."""
