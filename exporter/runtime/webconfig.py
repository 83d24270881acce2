"""``--web.config.file``: exporter-toolkit's web configuration, read, checked and re-read.

The format is exporter-toolkit's (``docs/web-configuration.md`` there), so one file serves
node_exporter and this sidecar alike::

    tls_server_config:
      cert_file: tls.crt            # or cert: <PEM>; relative paths are from the file's folder
      key_file: tls.key             # or key: <PEM>
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt        # or client_ca: <PEM>
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12            # TLS10..TLS13; max_version too
      cipher_suites: [...]          # Go's names, mapped to OpenSSL's
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...        # bcrypt, e.g. htpasswd -nBC 10 "" | tr -d ':\\n'
    rate_limit: {interval: 100ms, burst: 10}

Where Python's ``ssl`` cannot do what Go does, it says so rather than pretending:
``RequestClientCert`` and ``RequireAnyClientCert`` (Go: ask for a client certificate but do not
verify it) verify the certificate against the client CA here, so they need one;
``curve_preferences`` is checked and then left to OpenSSL's defaults; TLS 1.3 suites in
``cipher_suites`` are not configurable (in Go neither) and are ignored; ``http2`` is accepted and
the listener speaks HTTP/1.1 (ALPN ``http/1.1``). Each of these is one note in the log at start.

``load`` checks everything at start (the files exist and hold a matching certificate and key,
the client CA loads, every password is a bcrypt hash, no unknown key) and raises ``ConfigError``
with one line naming the problem; the command line exits 2 with it.

``WebConfigWatcher.current`` is asked for every new connection (its TLS context) and every
request (users, headers, rate limit). It stats the file and the files it names and reads them
again only when one changed (inode, size or modification time: a Kubernetes Secret update swaps
a symlink), so a rotated certificate is served to the next connection without a restart; SIGHUP
forces a read. A file that stops being valid is refused: the last good configuration stays in
force, the error is logged once, ``vllm_sidecar_web_config_last_reload_successful`` turns 0, and
it is tried again when the files change (or at most once a second). Whether TLS is on is decided
at start, as in exporter-toolkit: a change that turns it on or off is refused the same way.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import yaml

from ..errors import ConfigError

log = logging.getLogger("vllm_sidecar.http")

KEY = "web_config_file"

TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
TLS_KEYS = ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file",
            "client_allowed_sans", "min_version", "max_version", "cipher_suites",
            "prefer_server_cipher_suites", "curve_preferences")
HTTP_KEYS = ("http2", "headers")

CLIENT_AUTH = {  # exporter-toolkit's names -> (verify mode, needs a client CA)
    "NoClientCert": (ssl.CERT_NONE, False),
    "RequestClientCert": (ssl.CERT_OPTIONAL, True),
    "RequireAnyClientCert": (ssl.CERT_REQUIRED, True),
    "RequireClientCert": (ssl.CERT_REQUIRED, True),  # exporter-toolkit keeps it for compatibility
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
CLIENT_AUTH_NAMES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert",
                     "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

# Go's cipher suite names (crypto/tls.CipherSuites and InsecureCipherSuites) -> OpenSSL's
GO_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
CURVES = ("CurveP256", "CurveP384", "CurveP521", "X25519")

# exporter-toolkit's extraHTTPHeaders: the headers a file may set, and their allowed values
EXTRA_HEADERS: Dict[str, Tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

# an HTTP field value (RFC 9110 5.5) in ASCII: visible characters, inner spaces and tabs
_FIELD_VALUE_RE = re.compile(r"(?:[\x21-\x7e](?:[\x20\x09\x21-\x7e]*[\x21-\x7e])?)?")
BCRYPT_RE = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class TLSSettings:
    context: ssl.SSLContext
    client_auth: str
    allowed_sans: Tuple[str, ...] = ()


@dataclass(frozen=True)
class WebConfig:
    """One valid reading of the file (or the empty configuration when no file is given)."""

    path: str = ""
    tls: Optional[TLSSettings] = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Tuple[Tuple[str, str], ...] = ()
    rate_interval: float = 0.0  # seconds between requests; 0: no rate limit
    rate_burst: int = 0
    files: Tuple[str, ...] = ()  # the files it names, watched for changes
    notes: Tuple[str, ...] = ()  # settings accepted but not applied, logged at start


def _fail(path: str, msg: str) -> ConfigError:
    return ConfigError(f"{KEY}: {path}: {' '.join(str(msg).split())}")


def _mapping(path: str, where: str, value: Any, allowed: Tuple[str, ...]) -> Dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, f"{where}: expected a mapping, got {type(value).__name__}")
    for k in value:
        if str(k) not in allowed:
            known = ", ".join(allowed)
            raise _fail(path, f"{where}: unknown key {str(k)!r} (known: {known})" if where else
                        f"unknown key {str(k)!r} (known: {known})")
    return {str(k): v for k, v in value.items()}


def _text(path: str, where: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _fail(path, f"{where}: expected text, got {value!r}")
    return str(value)


def _strings(path: str, where: str, value: Any) -> List[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(path, f"{where}: expected a list, got {value!r}")
    return [_text(path, where, v) for v in value]


def _bool(path: str, where: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(path, f"{where}: expected true or false, got {value!r}")
    return value


def _duration(path: str, where: str, value: Any) -> float:
    """A Go duration ("100ms", "1m30s", "0"); a bare number is seconds."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise _fail(path, f"{where}: must not be negative, got {value!r}")
        return float(value)
    s = _text(path, where, value).strip()
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise _fail(path, f"{where}: {value!r} is not a duration like 100ms, 1s or 1m")
    return total


def _join(base: str, p: str) -> str:
    return p if not p or os.path.isabs(p) else os.path.join(base, p)


def _readable(path: str, where: str, p: str) -> None:
    try:
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise _fail(path, f"{where} {p}: cannot read: {exc.strerror or exc}") from None


class _PemFile:
    """An inline PEM (``cert:``, ``key:``) as a path OpenSSL can load: a memfd on Linux (nothing
    touches a disk, works on a read-only root filesystem), else a private temporary file."""

    def __init__(self, pem: str) -> None:
        self._fd: Optional[int] = None
        self._tmp: Optional[str] = None
        data = pem.encode()
        try:
            self._fd = os.memfd_create("vllm-sidecar-pem", 0)
            os.write(self._fd, data)
            self.path = f"/proc/self/fd/{self._fd}"
            if not os.path.exists(self.path):
                raise OSError("no /proc")
        except (AttributeError, OSError):
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            fd, self._tmp = tempfile.mkstemp(suffix=".pem")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            self.path = self._tmp

    def __enter__(self) -> "_PemFile":
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)
        if self._tmp is not None:
            os.unlink(self._tmp)


def _ssl_reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc)


def _tls(path: str, raw: Dict[str, Any], notes: List[str], files: List[str]) -> Optional[TLSSettings]:
    base = os.path.dirname(os.path.abspath(path))
    t = {k: raw.get(k) for k in TLS_KEYS}
    cert_pem = _text(path, "tls_server_config: cert", t["cert"])
    key_pem = _text(path, "tls_server_config: key", t["key"])
    ca_pem = _text(path, "tls_server_config: client_ca", t["client_ca"])
    cert_file = _join(base, _text(path, "tls_server_config: cert_file", t["cert_file"]))
    key_file = _join(base, _text(path, "tls_server_config: key_file", t["key_file"]))
    ca_file = _join(base, _text(path, "tls_server_config: client_ca_file", t["client_ca_file"]))
    auth = _text(path, "tls_server_config: client_auth_type", t["client_auth_type"])
    if not any((cert_pem, key_pem, ca_pem, cert_file, key_file, ca_file, auth)):
        if any(t[k] is not None for k in TLS_KEYS):
            notes.append("tls_server_config names no certificate, key or client CA: TLS is off")
        return None  # exporter-toolkit: no TLS settings, plain HTTP
    if cert_pem and cert_file:
        raise _fail(path, "tls_server_config: give cert or cert_file, not both")
    if key_pem and key_file:
        raise _fail(path, "tls_server_config: give key or key_file, not both")
    if ca_pem and ca_file:
        raise _fail(path, "tls_server_config: give client_ca or client_ca_file, not both")
    if not (cert_pem or cert_file):
        raise _fail(path, "tls_server_config: missing one of cert or cert_file")
    if not (key_pem or key_file):
        raise _fail(path, "tls_server_config: missing one of key or key_file")
    for name, p in (("cert_file", cert_file), ("key_file", key_file), ("client_ca_file", ca_file)):
        if p:
            _readable(path, f"tls_server_config: {name}", p)
            files.append(p)

    auth = auth or "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise _fail(path, f"tls_server_config: client_auth_type {auth!r} is not one of "
                          f"{', '.join(CLIENT_AUTH_NAMES)}")
    verify, needs_ca = CLIENT_AUTH[auth]
    has_ca = bool(ca_pem or ca_file)
    if has_ca and verify == ssl.CERT_NONE:
        raise _fail(path, "tls_server_config: a client CA is given but client_auth_type is NoClientCert; "
                          "set RequireAndVerifyClientCert to check client certificates")
    if needs_ca and not has_ca:
        raise _fail(path, f"tls_server_config: client_auth_type {auth} needs client_ca_file (or client_ca)")
    if auth in ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert"):
        notes.append(f"client_auth_type {auth}: client certificates are verified against the client CA "
                     "(Python's ssl cannot ask for a certificate without verifying it)")
    sans = tuple(_strings(path, "tls_server_config: client_allowed_sans", t["client_allowed_sans"]))
    if sans and verify == ssl.CERT_NONE:
        raise _fail(path, "tls_server_config: client_allowed_sans needs a client_auth_type that asks "
                          "for client certificates")

    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = _text(path, f"tls_server_config: {name}", t[name]) or default
        if v not in TLS_VERSIONS:
            raise _fail(path, f"tls_server_config: {name} {v!r} is not one of {', '.join(TLS_VERSIONS)}")
        versions[name] = TLS_VERSIONS[v]
    if versions["min_version"] > versions["max_version"]:
        raise _fail(path, "tls_server_config: min_version is above max_version")

    ciphers, ignored = [], []
    for c in _strings(path, "tls_server_config: cipher_suites", t["cipher_suites"]):
        if c in GO_CIPHERS:
            ciphers.append(GO_CIPHERS[c])
        elif c in TLS13_SUITES:
            ignored.append(c)
        else:
            raise _fail(path, f"tls_server_config: cipher_suites: unknown cipher {c!r}")
    if ignored:
        notes.append(f"cipher_suites: {', '.join(ignored)} ignored (TLS 1.3 suites are not configurable)")
    for c in _strings(path, "tls_server_config: curve_preferences", t["curve_preferences"]):
        if c not in CURVES:
            raise _fail(path, f"tls_server_config: curve_preferences: unknown curve {c!r}")
    if t["curve_preferences"]:
        notes.append("curve_preferences ignored: OpenSSL's default curves are used")
    prefer = _bool(path, "tls_server_config: prefer_server_cipher_suites", t["prefer_server_cipher_suites"], True)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version = versions["min_version"]
        ctx.maximum_version = versions["max_version"]
    except (ValueError, ssl.SSLError) as exc:
        raise _fail(path, f"tls_server_config: TLS versions refused by OpenSSL: {_ssl_reason(exc)}") from None
    if prefer:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if ciphers:
        try:
            ctx.set_ciphers(":".join(ciphers))
        except ssl.SSLError:
            raise _fail(path, "tls_server_config: cipher_suites: OpenSSL has none of them") from None
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        with _PemFile(cert_pem) if cert_pem else _Plain(cert_file) as cf, \
                _PemFile(key_pem) if key_pem else _Plain(key_file) as kf:
            ctx.load_cert_chain(cf.path, kf.path)
    except ssl.SSLError as exc:
        what = f"cert_file {cert_file}" if cert_file else "cert"
        raise _fail(path, f"tls_server_config: {what} and its key are not a matching PEM certificate "
                          f"and key ({_ssl_reason(exc)})") from None
    except OSError as exc:
        raise _fail(path, f"tls_server_config: cannot load the certificate: {exc.strerror or exc}") from None
    ctx.verify_mode = verify
    if has_ca:
        try:
            if ca_file:
                ctx.load_verify_locations(cafile=ca_file)
            else:
                ctx.load_verify_locations(cadata=ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            what = f"client_ca_file {ca_file}" if ca_file else "client_ca"
            raise _fail(path, f"tls_server_config: {what}: no PEM certificate loaded ({_ssl_reason(exc)})") from None
    return TLSSettings(context=ctx, client_auth=auth, allowed_sans=sans)


class _Plain:
    def __init__(self, p: str) -> None:
        self.path = p

    def __enter__(self) -> "_Plain":
        return self

    def __exit__(self, *exc) -> None:
        return None


def _users(path: str, raw: Any) -> Dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, f"basic_auth_users: expected a mapping of user to bcrypt hash, got {type(raw).__name__}")
    out = {}
    for user, hashed in raw.items():
        name = str(user)
        if ":" in name or not name:
            raise _fail(path, f"basic_auth_users: user {name!r}: a user name cannot be empty or hold ':'")
        h = hashed if isinstance(hashed, str) else ""
        m = BCRYPT_RE.fullmatch(h.strip())
        if not m or not 4 <= int(m.group(1)) <= 31:
            raise _fail(path, f"basic_auth_users: user {name!r}: not a bcrypt hash "
                              "(expected $2y$10$ and 53 characters, as htpasswd -nBC 10 makes)")
        out[name] = h.strip().encode()
    return out


def _headers(path: str, raw: Any) -> Tuple[Tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise _fail(path, "http_server_config: headers: expected a mapping of header to value")
    out = []
    for k, v in raw.items():
        name, value = str(k), _text(path, f"http_server_config: headers: {k}", v)
        if name not in EXTRA_HEADERS:
            raise _fail(path, f"http_server_config: headers: HTTP header {name!r} can not be configured "
                              f"(allowed: {', '.join(EXTRA_HEADERS)})")
        allowed = EXTRA_HEADERS[name]
        if allowed and value not in allowed:
            raise _fail(path, f"http_server_config: headers: invalid value for {name}: expected one of "
                              f"{', '.join(allowed)}, got {value!r}")
        if any(c in value for c in "\r\n\0"):
            raise _fail(path, f"http_server_config: headers: {name}: a value cannot hold a line break")
        if not _FIELD_VALUE_RE.fullmatch(value):  # what h11 would refuse to send, refused at load
            raise _fail(path, f"http_server_config: headers: {name}: a value must be printable ASCII "
                              "without leading or trailing blanks")
        if value:  # exporter-toolkit: unset if blank
            out.append((name, value))
    return tuple(out)


def load(path: str) -> WebConfig:
    """Read and check the web configuration file; ``ConfigError`` (one line) when it is wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _fail(path, "not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise _fail(path, "not valid YAML" + (f" at line {mark.line + 1}" if mark is not None else "")) from None
    top = _mapping(path, "", data, TOP_KEYS)
    notes: List[str] = []
    files: List[str] = []
    tls = _tls(path, _mapping(path, "tls_server_config", top.get("tls_server_config"), TLS_KEYS), notes, files)
    http = _mapping(path, "http_server_config", top.get("http_server_config"), HTTP_KEYS)
    _bool(path, "http_server_config: http2", http.get("http2"), True)
    headers = _headers(path, http.get("headers"))
    users = _users(path, top.get("basic_auth_users"))
    rate = _mapping(path, "rate_limit", top.get("rate_limit"), ("interval", "burst"))
    interval = _duration(path, "rate_limit: interval", rate.get("interval"))
    burst = rate.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        raise _fail(path, f"rate_limit: burst: expected a whole number >= 0, got {burst!r}")
    if interval > 0 and burst < 1:
        raise _fail(path, "rate_limit: burst must be at least 1 when interval is set (0 would refuse every request)")
    return WebConfig(path=path, tls=tls, users=users, headers=headers, rate_interval=interval,
                     rate_burst=burst, files=tuple(files), notes=tuple(notes))


def _stat(p: str) -> Tuple:
    try:
        st = os.stat(p)
    except OSError as exc:
        return (p, exc.errno)
    return (p, st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


class WebConfigWatcher:
    """The web configuration in force, read again when its files change (see the module doc).

    ``current`` is called from one thread (the server's event loop); ``force`` may be called from
    any (a signal handler)."""

    RETRY_SECONDS = 1.0

    def __init__(self, path: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self.cfg = load(path) if path else WebConfig()
        self._sig = self._signature(self.cfg)
        self._retry_at = 0.0
        self._failed_sig: Tuple = ()
        self._forced = False
        self._last_error = ""
        self.last_reload_ok = True
        self.reloads = 0

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def _signature(self, cfg: WebConfig) -> Tuple:
        if not self.path:
            return ()
        return tuple(_stat(p) for p in (self.path,) + cfg.files)

    def force(self) -> None:
        self._forced = True

    def current(self) -> WebConfig:
        if not self.path:
            return self.cfg
        sig = self._signature(self.cfg)
        forced, self._forced = self._forced, False
        if sig == self._sig and not forced:
            return self.cfg
        now = self._clock()
        if not forced and not self.last_reload_ok and sig == self._failed_sig and now < self._retry_at:
            return self.cfg
        try:
            new = load(self.path)
            if (new.tls is None) != (self.cfg.tls is None):
                raise ConfigError(f"{KEY}: {self.path}: turning TLS {'on' if new.tls else 'off'} needs a restart")
        except ConfigError as exc:
            self._failed_sig, self._retry_at = sig, now + self.RETRY_SECONDS
            self.last_reload_ok = False
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                log.error("web config not re-read, the previous one stays in force: %s", exc)
            return self.cfg
        self.cfg, self._sig = new, self._signature(new)
        self.last_reload_ok, self._last_error = True, ""
        self.reloads += 1
        log.info("web config re-read from %s", self.path)
        return self.cfg


def sans_allowed(peercert: Optional[dict], allowed: Tuple[str, ...]) -> bool:
    """exporter-toolkit's client_allowed_sans: a SAN of the (verified) client certificate, DNS,
    IP, e-mail or URI, must equal an entry of the list."""
    if not allowed:
        return True
    if not peercert:
        return False
    values = []
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                value = str(ipaddress.ip_address(value.strip()))
            except ValueError:
                pass
        values.append(value)
    return any(v in allowed for v in values)
