"""The llama.cpp build's inputs (issue 41): the pinned sdist fetched straight from the file host, bounded (a deadline,
a size cap) and checked against its sha256, with pip download as the way in when that fails; only the target a
trial runs is built."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from spectrial.engines import llamacpp_build as build


@pytest.fixture
def served() -> Iterator[dict]:
    """A real HTTP server on loopback answering with `state["body"]` (or `state["status"]`)."""
    state: dict = {"body": b"", "status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(state["status"])
            self.send_header("Content-Length", str(len(state["body"])))
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{srv.server_address[1]}/llama_cpp_python.tar.gz"
    yield state
    srv.shutdown()


def test_the_sdist_comes_only_with_its_pinned_sha256(served: dict, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    body = b"sdist bytes " * 1000
    served["body"] = body
    monkeypatch.setattr(build, "SDIST_URL", served["url"])
    dest = tmp_path / "s.tar.gz"
    why = build._fetch_sdist(dest)  # the real pin: these bytes are not the sdist
    assert why is not None and why.startswith("sha256 ") and build.SDIST_SHA256 in why and not dest.exists()
    monkeypatch.setattr(build, "SDIST_SHA256", hashlib.sha256(body).hexdigest())
    assert build._fetch_sdist(dest) is None and dest.read_bytes() == body
    monkeypatch.setattr(build, "SDIST_MAX_BYTES", 4096)
    assert "over 4096 bytes" in build._fetch_sdist(tmp_path / "big.tar.gz") and not (tmp_path / "big.tar.gz").exists()
    served["status"], served["body"] = 404, b""
    assert build._fetch_sdist(tmp_path / "gone.tar.gz") == f"HTTP 404 from {served['url']}"
    assert not list(tmp_path.glob("*.part"))  # nothing half-written is left


def test_only_known_targets_are_built() -> None:
    with pytest.raises(ValueError, match="no llama.cpp target for 'llama-cli'; known: llama-server, rpc-server"):
        build.ensure_binary("llama-cli")
    assert build.TARGETS == {"llama-server": "llama-server", "rpc-server": "ggml-rpc-server"}
