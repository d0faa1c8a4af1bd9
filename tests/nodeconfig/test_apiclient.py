"""The API client's inputs from the kubeconfig: the file and those it names are read
bounded (regular files only, a byte cap), hostile YAML ends in one line, a token
that cannot go in a header is refused without echoing it."""

from __future__ import annotations

import json
import os
import re
import resource
import time
from pathlib import Path
from typing import Any

import pytest

from numa_device_plugin.nodeconfig.apiclient import (
    ApiConfigError,
    ApiRequestError,
    _read_token,
    from_kubeconfig,
)


def kubeconfig(tmp_path: Path, user: dict[str, Any] | None = None, **cluster: Any) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1", **cluster}}],
        "users": [{"name": "u", "user": user or {"token": "t"}}],
    }))  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("make", "fault"),
    [
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
        (lambda p: p.write_bytes(b"#" * (5 << 20)), "is over 4194304 bytes"),
    ],
    ids=["fifo", "dev-zero", "huge"],
)
def test_a_kubeconfig_that_is_no_regular_file_or_too_large_is_refused_at_once(
    tmp_path: Path, make: Any, fault: str
) -> None:
    path = tmp_path / "kubeconfig"
    make(path)
    started = time.monotonic()
    with pytest.raises(ApiConfigError, match=fault):
        from_kubeconfig(path)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("field", ["tokenFile", "certificate-authority", "client-certificate"])
def test_a_fifo_named_by_the_kubeconfig_is_refused_without_blocking(
    tmp_path: Path, field: str
) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "key.pem").write_text("x")
    if field == "tokenFile":
        target = from_kubeconfig(kubeconfig(tmp_path, {"tokenFile": "fifo"}))
        with pytest.raises(ApiConfigError, match="fifo: not a regular file"):
            target.get("/", 1)
        return
    if field == "certificate-authority":
        path = kubeconfig(tmp_path, None, **{field: "fifo"})
    else:
        path = kubeconfig(tmp_path, {"client-certificate": "fifo", "client-key": "key.pem"})
    with pytest.raises(ApiConfigError, match="not a regular file"):
        from_kubeconfig(path)


def test_an_alias_bomb_as_current_context_is_named_by_its_type_not_expanded(
    tmp_path: Path,
) -> None:
    bomb = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
    )
    path = tmp_path / "kubeconfig"
    path.write_text(bomb + "current-context: *i\ncontexts: []\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ApiConfigError, match=re.escape("no context named <a list> in contexts")):
        from_kubeconfig(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB


def test_a_deeply_nested_kubeconfig_is_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("a: " + "[" * 100_000 + "]" * 100_000)
    with pytest.raises(ApiConfigError, match="kubeconfig: cannot read") as caught:
        from_kubeconfig(path)
    assert len(str(caught.value)) < 400


def test_a_token_with_a_line_break_is_refused_without_echoing_it(tmp_path: Path) -> None:
    target = from_kubeconfig(kubeconfig(tmp_path, {"token": "secret-value\r\nX-Evil: 1"}))
    with pytest.raises(ApiConfigError, match="control or non-ASCII characters") as caught:
        target.get("/api/v1/nodes/n1", 1)
    assert "secret-value" not in str(caught.value)


def test_a_token_file_is_read_at_each_request_up_to_its_cap(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(" t1\n")
    assert _read_token(token) == "t1"
    token.write_bytes(b"t" * (65 << 10))
    with pytest.raises(ApiConfigError, match="is over 65536 bytes"):
        _read_token(token)


def test_the_token_goes_as_a_bearer_token_and_a_token_file_is_read(tmp_path: Path) -> None:
    """Mutants: the ``Bearer `` prefix dropped (the stand-ins once stripped it instead of
    requiring it); ``tokenFile`` ignored."""
    from tests.apiserver_stub import node_api

    with node_api("n1", tmp_path) as (api, kubeconfig):
        from_kubeconfig(kubeconfig).get("/api/v1/nodes/n1", 5)
        document = json.loads(kubeconfig.read_text())
        (tmp_path / "token").write_text("from-file\n")
        document["users"][0]["user"] = {"tokenFile": "token"}
        kubeconfig.write_text(json.dumps(document))
        answer = from_kubeconfig(kubeconfig).get("/api/v1/nodes/n1", 5)
    assert answer.status == 200
    assert api.tokens == ["stub-token", "from-file"]


def test_an_answer_over_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from numa_device_plugin.nodeconfig import apiclient
    from numa_device_plugin.nodeconfig.apiclient import ApiRequestError
    from tests.apiserver_stub import node_api

    monkeypatch.setattr(apiclient, "MAX_ANSWER", 20)
    with (
        node_api("n1", tmp_path) as (_, kubeconfig),
        pytest.raises(ApiRequestError, match="is over 20 bytes"),
    ):
        from_kubeconfig(kubeconfig).get("/api/v1/nodes/n1", 5)


@pytest.mark.parametrize("server", ["ftp://127.0.0.1:21", "127.0.0.1:6443", "https://"])
def test_a_server_that_is_no_http_url_is_refused(tmp_path: Path, server: str) -> None:
    document = json.loads(kubeconfig(tmp_path).read_text())
    document["clusters"][0]["cluster"]["server"] = server
    (tmp_path / "kubeconfig").write_text(json.dumps(document))
    with pytest.raises(ApiConfigError, match="is not an http\\(s\\) URL"):
        from_kubeconfig(tmp_path / "kubeconfig")


def test_a_kind_style_kubeconfig_with_data_fields_and_a_client_certificate_works(
    tmp_path: Path,
) -> None:
    """The usual kubeadm/kind kubeconfig: ``certificate-authority-data`` and
    ``client-certificate-data``/``client-key-data`` (base64 PEM), no token; the server
    requires the client certificate."""
    import base64

    from tests.apiserver_stub import make_client_certificate, make_tls, node_api
    from tests.conftest import require_tool

    require_tool("openssl", "the Debian package openssl makes the test certificates")
    tls = make_tls(tmp_path / "tls")
    cert, key = make_client_certificate(tls)

    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    with node_api("n1", tmp_path, tls=tls, client_certificates=True) as (api, kubeconfig):
        document = json.loads(kubeconfig.read_text())
        cluster = document["clusters"][0]["cluster"]
        cluster["certificate-authority-data"] = data(Path(cluster.pop("certificate-authority")))
        document["users"][0]["user"] = {
            "client-certificate-data": data(cert), "client-key-data": data(key)
        }  # fmt: skip
        kubeconfig.write_text(json.dumps(document))
        assert from_kubeconfig(kubeconfig).get("/api/v1/nodes/n1", 10).status == 200
        # Without the client certificate the server refuses the TLS handshake.
        document["users"][0]["user"] = {"token": "t"}
        kubeconfig.write_text(json.dumps(document))
        with pytest.raises(ApiRequestError):
            from_kubeconfig(kubeconfig).get("/api/v1/nodes/n1", 10)
        # insecure-skip-tls-verify: no CA needed, the certificate is taken as it is.
        del cluster["certificate-authority-data"]
        cluster["insecure-skip-tls-verify"] = True
        document["users"][0]["user"] = {
            "client-certificate-data": data(cert), "client-key-data": data(key)
        }  # fmt: skip
        kubeconfig.write_text(json.dumps(document))
        assert from_kubeconfig(kubeconfig).get("/api/v1/nodes/n1", 10).status == 200
    assert api.tokens == ["", ""]


def test_a_certificate_authority_data_that_is_not_base64_is_named(tmp_path: Path) -> None:
    with pytest.raises(ApiConfigError, match="certificate-authority-data is not base64"):
        from_kubeconfig(kubeconfig(tmp_path, None, **{"certificate-authority-data": "@@@"}))
