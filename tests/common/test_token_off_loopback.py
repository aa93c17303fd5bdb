"""The bearer token is optional on loopback and required off it: every service, as a user starts it.

No traffic leaves loopback: a refused service exits before it binds anything, and the guarded one is
asked on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time

import httpx
import pytest

from common.addresses import is_loopback
from common.service import missing_token_problem
from tests.env_service.service_support import write_conf
from tests.helpers import REPO, free_port, run_service

SERVICES = ("llm_server", "env_service", "task_manager", "experience_manager", "judge", "studio")


@pytest.mark.parametrize("module", SERVICES)
def test_a_service_bound_off_loopback_without_a_token_refuses_to_start(module):
    env = {k: v for k, v in os.environ.items() if k != "EVOLVER_API_TOKEN"}
    done = subprocess.run([sys.executable, "-m", module, "--host", "0.0.0.0", "--port", str(free_port())],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{module}: refusing to listen on 0.0.0.0 without a bearer token" in done.stderr
    assert "Set EVOLVER_API_TOKEN" in done.stderr and "--host 127.0.0.1" in done.stderr


def test_which_addresses_need_a_token():
    for host in ("127.0.0.1", "127.0.0.3", "localhost", "::1"):
        assert is_loopback(host) and missing_token_problem("x", host, {}) is None
    for host in ("0.0.0.0", "", "::", "10.1.2.3", "node-7.cluster"):
        assert not is_loopback(host)
        assert "refusing to listen" in str(missing_token_problem("x", host, {}))
        assert missing_token_problem("x", host, {"EVOLVER_API_TOKEN": "t"}) is None


def test_with_a_token_a_refused_call_gets_401_and_stores_nothing(tmp_path):
    conf = write_conf(tmp_path, environments={"flights": {"splits": {"train": 4, "validation": 2, "test": 2}}})
    token = "run-token-7f3a"
    with run_service("env_service", ["--host", "0.0.0.0", "--conf", str(conf), "--log-level", "WARNING"],
                     env={"EVOLVER_API_TOKEN": token}) as service:
        assert service.url.startswith("http://127.0.0.1:")
        create = {"env": "flights", "task_id": "train-0000"}
        with httpx.Client(base_url=service.url, timeout=30, trust_env=False) as client:
            assert client.get("/healthz").status_code == 200  # open: the launcher's probe carries no token
            missing = client.post("/v1/instances", json=create)
            wrong = client.post("/v1/instances", json=create, headers={"Authorization": "Bearer not-the-token"})
            assert missing.status_code == wrong.status_code == 401
            assert missing.json()["error"]["code"] == "unauthorized"
            assert client.get("/v1/instances").status_code == 401
            good = {"Authorization": f"Bearer {token}"}
            listed = client.get("/v1/instances", headers=good)
            assert listed.status_code == 200 and listed.json()["instances"] == [], "a refused create stored nothing"
            made = client.post("/v1/instances", json=create, headers=good)
            assert made.status_code == 201
            live = client.get("/v1/instances", headers=good).json()["instances"]
            assert [i["instance_id"] for i in live] == [made.json()["instance_id"]]


def self_signed(directory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, made here (the `cryptography` package httpx already needs)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls_through_uvicorns_settings(tmp_path):
    cert, key = self_signed(tmp_path)
    conf = write_conf(tmp_path, environments={"flights": {"splits": {"train": 4, "validation": 2, "test": 2}}},
                      tls_certfile=cert, tls_keyfile=key)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "EVOLVER_API_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--port", str(port), "--conf", str(conf),
                             "--log-level", "WARNING"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=cert), timeout=5, trust_env=False) as client:
            for _ in range(240):
                try:
                    if client.get(f"https://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    assert proc.poll() is None, "env_service exited"
                    time.sleep(0.25)
            assert client.get(f"https://127.0.0.1:{port}/v1/environments").status_code == 200
        with pytest.raises(httpx.TransportError):  # plain HTTP gets no answer
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5, trust_env=False)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
