"""gs:// credentials end to end: a save and a load whose every request
carries the token that Google's token endpoint (here a local one that
checks what Google's would: the JWT's RS256 signature against the service
account's public key, its audience, issuer, scope and lifetime) or the
metadata server handed out. Storage is the emulator, behind the fault
proxy, which records each request's Authorization header."""

import base64
import http.server
import json
import threading
import time
import urllib.parse

import numpy as np
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

import shardkeep as sk
from s3_fault_proxy import FaultProxy

SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
EMAIL = "trainer@project.iam.gserviceaccount.com"


def _unpadded(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class GoogleEndpoints:
    """A token endpoint and a metadata server on one local port."""

    def __init__(self, public_key):
        self.public_key = public_key
        self.requests: list[str] = []
        self.refusals: list[str] = []
        endpoints = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status, body, headers=()):
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                form = urllib.parse.parse_qs(
                    self.rfile.read(int(self.headers["Content-Length"])).decode())
                endpoints.requests.append(self.path)
                status, body = endpoints.token(self.path, form)
                self._answer(status, body)

            def do_GET(self):
                endpoints.requests.append(self.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._answer(403, {"error": "missing Metadata-Flavor"})
                flavor = [("Metadata-Flavor", "Google")]
                if self.path.endswith("/service-accounts/default/email"):
                    return self._answer(200, EMAIL.encode(), flavor)
                if self.path.endswith("/service-accounts/default/token"):
                    return self._answer(200, {"access_token": "metadata-token",
                                              "expires_in": 3599, "token_type": "Bearer"}, flavor)
                self._answer(404, {"error": "not found"}, flavor)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    @property
    def token_uri(self) -> str:
        return f"http://{self.host}/token"

    def token(self, path: str, form: dict) -> tuple[int, dict]:
        grant = form.get("grant_type", [""])[0]
        if grant == "refresh_token":
            if form.get("refresh_token") == ["the-refresh-token"] and \
                    form.get("client_secret") == ["the-client-secret"]:
                return 200, {"access_token": "user-token", "expires_in": 3599}
            return self.refuse("refresh token or client refused")
        if grant != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return self.refuse(f"grant_type {grant!r}")
        header, claims, signature = form["assertion"][0].split(".")
        if json.loads(_unpadded(header)).get("alg") != "RS256":
            return self.refuse("not RS256")
        try:
            self.public_key.verify(_unpadded(signature), f"{header}.{claims}".encode(),
                                   padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            return self.refuse("Invalid JWT Signature.")
        claims = json.loads(_unpadded(claims))
        now = time.time()
        if claims.get("aud") != self.token_uri or claims.get("iss") != EMAIL:
            return self.refuse("audience or issuer")
        if claims.get("scope") != SCOPE:
            return self.refuse("scope")
        if not (abs(claims["iat"] - now) < 60 and claims["exp"] - claims["iat"] == 3600):
            return self.refuse("lifetime")
        return 200, {"access_token": "service-account-token", "expires_in": 3599,
                     "token_type": "Bearer"}

    def refuse(self, why: str) -> tuple[int, dict]:
        self.refusals.append(why)
        return 400, {"error": "invalid_grant", "error_description": why}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


@pytest.fixture
def account_key():
    return _key()


@pytest.fixture
def google(account_key):
    endpoints = GoogleEndpoints(account_key.public_key())
    yield endpoints
    endpoints.close()


@pytest.fixture
def through_proxy(gcs, gcs_server, monkeypatch, tmp_path):
    """The emulator behind the recording proxy, named in the options; no
    emulator variable (it would mean anonymous access) and no credentials
    of the machine's own."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # nothing listens there
    proxy = FaultProxy(gcs_server.endpoint)
    yield proxy, sk.Options(gcs=sk.GcsSettings(endpoint=proxy.endpoint_url))
    proxy.close()


def _save_and_load(gcs, options, name):
    state = {"w": np.arange(3 << 18, dtype=np.float32), "step": 4}
    sk.save(gcs.url(f"{name}/1"), state, options=options)
    out = sk.load(gcs.url(f"{name}/1"), options=options)
    np.testing.assert_array_equal(out["w"], state["w"])


def _service_account_file(path, key, token_uri) -> str:
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "project", "private_key_id": "key-1",
        "private_key": _pem(key), "client_email": EMAIL, "token_uri": token_uri}))
    return str(path)


def test_a_service_account_key_file_signs_a_jwt_that_the_token_endpoint_accepts(
        gcs, google, account_key, through_proxy, monkeypatch, tmp_path):
    proxy, options = through_proxy
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", _service_account_file(
        tmp_path / "key.json", account_key, google.token_uri))
    _save_and_load(gcs, options, "sa")
    assert google.refusals == []
    assert google.requests == ["/token"]  # one token, cached for every request
    assert proxy.seen and {s.authorization for s in proxy.seen} == {
        "Bearer service-account-token"}


def test_a_key_the_endpoint_does_not_know_is_refused_and_no_secret_is_quoted(
        gcs, google, through_proxy, monkeypatch, tmp_path):
    _, options = through_proxy
    other = _key()
    key_file = _service_account_file(tmp_path / "key.json", other, google.token_uri)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", key_file)
    with pytest.raises(sk.InvalidArgumentError) as raised:
        sk.save(gcs.url("refused/1"), {"w": np.arange(4)}, options=options)
    message = str(raised.value)
    assert google.refusals == ["Invalid JWT Signature."]
    assert EMAIL in message and google.token_uri in message and "invalid_grant" in message
    pem_body = _pem(other).splitlines()[5]
    assert pem_body not in message and "eyJ" not in message  # no key, no JWT


def test_the_metadata_server_of_a_vm(gcs, google, through_proxy, monkeypatch):
    proxy, options = through_proxy
    monkeypatch.setenv("GCE_METADATA_HOST", google.host)
    _save_and_load(gcs, options, "vm")
    assert {s.authorization for s in proxy.seen} == {"Bearer metadata-token"}
    assert any(r.endswith("/default/token") for r in google.requests)


def test_gclouds_user_credentials(gcs, google, through_proxy, tmp_path):
    proxy, options = through_proxy
    (tmp_path / "gcloud").mkdir()
    (tmp_path / "gcloud" / "application_default_credentials.json").write_text(json.dumps({
        "type": "authorized_user", "client_id": "123.apps.googleusercontent.com",
        "client_secret": "the-client-secret", "refresh_token": "the-refresh-token",
        "token_uri": google.token_uri}))
    _save_and_load(gcs, options, "user")
    assert {s.authorization for s in proxy.seen} == {"Bearer user-token"}


def test_without_any_credentials_requests_go_anonymous(gcs, through_proxy):
    proxy, options = through_proxy
    _save_and_load(gcs, options, "anonymous")
    assert {s.authorization for s in proxy.seen} == {None}
