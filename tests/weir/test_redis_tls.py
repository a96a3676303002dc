"""The Redis URL may use TLS (``rediss://``): the whole mesh serves over an encrypted Redis."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_mesh
from weir.redis_server import find_redis_server, free_port, wait_for_port


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    ca_key, ca_cert = folder / "ca.key", folder / "ca.crt"
    key, csr, cert = folder / "server.key", folder / "server.csr", folder / "server.crt"
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    commands = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=weir-test-ca",
         "-keyout", ca_key, "-out", ca_cert],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key,
         "-out", csr],
        ["x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
         "-days", "1", "-extfile", ext, "-out", cert],
    ]  # fmt: skip
    for args in commands:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    return ca_cert, cert, key


@pytest.mark.timeout(90)
def test_mesh_serves_over_a_tls_redis(tmp_path: Path, tiny_repository: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make test certificates")
    ca, cert, key = make_certificates(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        [find_redis_server(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        try:
            wait_for_port(port, 5)
        except TimeoutError:
            server.kill()
            output = server.communicate()[0].decode(errors="replace")
            pytest.skip(f"this redis-server has no TLS support: {output.strip()[-200:]}")
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
        mesh = start_mesh(url, tiny_repository)
        try:
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                "data": [0.5] * 64}]}  # fmt: skip
            response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body, timeout=30)
            assert response.status_code == 200, response.text
        finally:
            mesh.stop()
    finally:
        server.terminate()
        server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
