"""A new user's first hour at the command line (issue 31): errors that name the right level's keys with a
did-you-mean, a bare `spectrial trial`, `--version`, `--output-dir`, report.html after a trial, a fast `--help`, a
dry run that can be pasted, and SSH failures that say what is wrong in one line (real sshd where one is needed)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd_plugin import SSHD, SshdServer, free_port

from spectrial.errors import ConfigError, HostError, HostKeyError
from spectrial.hosts.ssh import SSHHost
from spectrial.params import load_params, parse_overrides
from spectrial.protocol.plan import dry_run
from spectrial.secrets import is_secret_name, mask_mapping

pytest_plugins = ["sshd_plugin"]

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "params" / "local.yaml"
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECTRIAL, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def config_error(overrides: list[str], path: Path = LOCAL) -> str:
    with pytest.raises(ConfigError) as info:
        params = load_params(path, parse_overrides(overrides))
        dry_run(params)  # the engine validates engine_config
    return str(info.value)


# --- errors: the keys of the level the mistake is at, and the closest one --------------------------------------
def test_engine_config_typo_lists_the_engines_keys_with_a_did_you_mean() -> None:
    msg = config_error(["engine_config.thread=2"])
    line = next(ln for ln in msg.splitlines() if "engine_config.thread:" in ln)
    assert "did you mean 'threads'?" in line
    allowed = line.split("allowed here: ")[1].split(", ")
    assert {"threads", "ctx_size", "gpu_layers"} <= set(allowed)  # llama.cpp's settings
    assert "arms" not in allowed and "concurrency" not in allowed  # not the top level's


def test_another_engines_config_is_named_as_such() -> None:
    msg = config_error(["engine=sglang"])  # local.yaml's engine_config holds llama.cpp's threads and ctx_size
    assert "engine_config (engine sglang)" in msg
    assert "'threads' is a setting of engine llamacpp, but these params run engine sglang" in msg
    assert "-p engine_config={}" in msg
    assert "tp_size" in msg  # SGLang's own keys are what is allowed there
    assert "did you mean 'tp_size'" not in msg  # ctx_size is not a typo of tp_size
    # and the advice works: SGLang's defaults validate
    params = load_params(LOCAL, parse_overrides(["engine=sglang", "engine_config={}"]))
    assert params.engine == "sglang" and params.engine_config == {}


@pytest.mark.parametrize("override, where, suggestion", [
    ("stpes=2", "stpes", "'steps'"),
    ("ssh.key=~/.ssh/id", "ssh.key", "'key_filename'"),
    ("sampling.temp=0.5", "sampling.temp", "'temperature'"),
    ("arms.0.methd=none", "arms.0.methd", "'method'"),
    ("workload.0.nn=3", "workload.0.nn", "'n'"),
    ("key_filename=~/.ssh/id", "key_filename", "ssh.key_filename"),
])
def test_every_unknown_key_gets_a_did_you_mean(override: str, where: str, suggestion: str) -> None:
    msg = config_error([override])
    line = next(ln for ln in msg.splitlines() if f"- {where}:" in ln)
    assert f"unknown parameter (did you mean {suggestion}" in line, line


def test_a_key_of_a_section_is_not_suggested_for_another_section() -> None:
    msg = config_error(["ssh.port=2222"])  # the SSH port belongs in the host spec, not the server's `port`
    line = next(ln for ln in msg.splitlines() if "- ssh.port:" in ln)
    assert "did you mean" not in line and "allowed here: backoff_s" in line


def test_sweep_unknown_keys_get_a_did_you_mean() -> None:
    res = cli("sweep", "params/sweep-local.yaml", "-p", "stpes=2")
    assert res.returncode == 2 and "stpes (did you mean steps?)" in res.stderr


# --- the command line -----------------------------------------------------------------------------------------
def test_version() -> None:
    import importlib.metadata

    res = cli("--version")
    assert res.returncode == 0
    assert res.stdout.startswith(f"spectrial {importlib.metadata.version('spectrial')} (")


def test_help_imports_neither_pandas_nor_the_gate() -> None:
    code = ("import sys, time; t = time.perf_counter(); from spectrial.cli import app\n"
            "from typer.testing import CliRunner\n"
            "r = CliRunner().invoke(app, ['--help'])\n"
            "print(r.exit_code, time.perf_counter() - t, sorted(m for m in ('pandas', 'spectrial.gate.run', "
            "'spectrial.logs.api', 'spectrial.analysis.figures') if m in sys.modules))\n"
            "print(r.output)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    first, _, output = res.stdout.partition("\n")
    code_, _elapsed, loaded = first.split(" ", 2)
    assert code_ == "0" and loaded == "[]", res.stdout + res.stderr
    for name in ("trial", "sweep", "gate", "watch", "logs", "nccl-check"):  # the lazy ones are listed too
        assert re.search(rf"│ {re.escape(name)}\s", output), name


def test_lazy_commands_are_listed_with_their_own_help() -> None:
    from typer.testing import CliRunner

    from spectrial.cli import LAZY, app

    for name, lazy in LAZY.items():
        res = CliRunner().invoke(app, [name, "--help"])  # loads the real command
        assert res.exit_code == 0, res.output
        assert lazy.help and " ".join(lazy.help.split()[:6]) in " ".join(res.output.replace("│", " ").split())


def test_a_bare_trial_uses_the_embedded_default_and_says_so() -> None:
    res = cli("trial", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "no params file given: using the embedded default params/local.yaml" in res.stderr
    assert "# arm baseline on local" in res.stdout and "# arm eagle3-synthetic" in res.stdout


def test_dry_run_prints_paths_that_can_be_pasted() -> None:
    arms = dry_run(load_params(LOCAL))
    target = arms[0].resolved["tiny:target"]
    assert target.endswith("/target.gguf") and "/models/tiny-" in target
    assert not any("tiny:" in a for arm in arms for a in arm.argv)
    assert arms[0].argv[arms[0].argv.index("-m") + 1] == target
    assert f"written by a real run to {target}" in arms[0].display
    draft = arms[1].argv[arms[1].argv.index("-md") + 1]
    assert draft.endswith("/draft-simple.gguf")
    # the same name a real run resolves (spectrial.engines.llamacpp writes it there)
    from spectrial.models import ensure_tiny_models

    assert Path(target) == ensure_tiny_models().dir / "target.gguf"


def test_dry_run_on_an_ssh_host_shows_the_uploaded_paths() -> None:
    arms = dry_run(load_params(LOCAL, {"host": "ssh://u@gpu-box:2222"}))
    line = next(ln for ln in arms[0].display.splitlines() if "llama-server" in ln and not ln.startswith("#"))
    assert line.startswith("~/.cache/spectrial/llama.cpp/bin/")  # unquoted: the remote shell expands ~
    assert " -m ~/.cache/spectrial/models/tiny-" in line and "'~" not in line
    assert any("uploaded to ~/.cache/spectrial/models/" in n for n in arms[0].where)
    assert any(n.startswith("engine_bin: auto is spectrial's llama.cpp build") for n in arms[0].where)
    with pytest.raises(ConfigError, match="written on the local host only"):
        dry_run(load_params(LOCAL, parse_overrides(["host=ssh://u@gpu-box", "engine=vllm", "engine_config={}",
                                                    "draft=tiny:draft", "arms.1.draft=tiny:draft"])))


def test_output_dir_is_an_option_of_sweep_too() -> None:
    res = cli("sweep", "params/sweep-local.yaml", "--output-dir", "/nonexistent-x", "-p", "stpes=2")
    assert "No such option" not in res.stderr and "stpes" in res.stderr


@pytest.mark.slow
def test_a_trial_writes_its_report_and_says_where(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = cli("trial", "--output-dir", str(tmp_path), "-p", "repeats=1", "-p", "warmup=0", "--quiet", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = next(tmp_path.glob("*/manifest.json")).parent
    assert f"run record: {run_dir / 'manifest.json'}" in res.stdout
    assert f"report: {run_dir / 'report.html'}" in res.stdout
    assert (run_dir / "report.html").stat().st_size > 100_000  # plotly embedded
    assert time.monotonic() - t0 < 300
    from typer.testing import CliRunner

    from spectrial.cli import app

    out = CliRunner().invoke(app, ["report", "--output-dir", str(tmp_path)])  # the command it prints works
    assert out.exit_code == 0 and str(run_dir / "report.html") in out.output


def test_no_report_prints_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spectrial.cli import report_line

    report_line(tmp_path / "20261202-000000-x-abcd", write=False)
    assert capsys.readouterr().out == f"report: write it with: spectrial report {tmp_path}/20261202-000000-x-abcd\n"


# --- records: a key path is not a secret ------------------------------------------------------------------------
def test_key_filename_is_recorded_unmasked() -> None:
    assert not is_secret_name("key_filename") and not is_secret_name("HF_TOKEN_PATH")
    assert is_secret_name("HF_TOKEN") and is_secret_name("ssh_key")
    shown = mask_mapping({"ssh": {"key_filename": "~/.ssh/id_ed25519"}, "env": {"API_KEY": "abc"}})
    assert shown == {"ssh": {"key_filename": "~/.ssh/id_ed25519"}, "env": {"API_KEY": "***"}}


def test_a_connection_error_never_says_exit_none() -> None:
    err = HostError("ssh://h", "ssh connect h:22: connection refused", None)
    assert "exit None" not in str(err) and str(err).startswith("on ssh://h: failed: ssh connect h:22")


# --- SSH: one clear line ------------------------------------------------------------------------------------
@contextlib.contextmanager
def not_ssh_server() -> Iterator[int]:
    """A port that answers TCP with an HTTP error and closes: paramiko's banner read fails there."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = srv.accept()
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(2)
        srv.close()


def test_an_unreachable_host_prints_one_line_and_the_hint(tmp_path: Path) -> None:
    with not_ssh_server() as port:
        res = cli("trial", "params/local.yaml", "-p", f"host=ssh://127.0.0.1:{port}", "-p", "ssh.retries=1",
                  "-p", "ssh.backoff_s=0.05", "--output-dir", str(tmp_path))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and "paramiko" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("[spectrial] plan: ")]  # the price first
    assert lines[0] == (f"error: on ssh://127.0.0.1:{port}: failed: ssh connect 127.0.0.1:{port}: no SSH server "
                        "answered on that port (Error reading SSH protocol banner)")
    assert len(lines) == 2 and lines[1].startswith("hint: gave up after 2 attempt(s)")
    refused = cli("trial", "params/local.yaml", "-p", f"host=ssh://127.0.0.1:{free_port()}", "-p", "ssh.retries=0",
                  "--output-dir", str(tmp_path))
    first = next(ln for ln in refused.stderr.splitlines() if not ln.startswith("[spectrial] plan: "))
    assert refused.returncode == 2 and ": connection refused" in first
    assert "exit None" not in refused.stderr and "[Errno None]" not in refused.stderr


def test_a_missing_alias_names_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu-a\n    HostName 127.0.0.1\n")
    host = SSHHost.from_spec("ssh:gpu-bx-spectrial-absent", ssh_config=str(config), retries=0)
    with pytest.raises(ConfigError) as info:
        host.connect()
    assert str(info.value).startswith(f"host: host alias 'gpu-bx-spectrial-absent' not found in {config}")
    assert info.value.parameter == "host" and "exit None" not in str(info.value)
    assert "Host gpu-bx-spectrial-absent" in info.value.hint and "ssh.ssh_config" in info.value.hint


def sha256_of(pub: str, tmp_path: Path) -> str:
    f = tmp_path / "fp.pub"
    f.write_text(pub.strip() + "\n")
    return subprocess.run(["ssh-keygen", "-lf", str(f)], check=True, capture_output=True,
                          text=True).stdout.split()[1]


@pytest.mark.ssh
def test_a_changed_host_key_advises_the_command_for_its_port_and_file(sshd: SshdServer, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "old")], check=True)
    old = (tmp_path / "old.pub").read_text().split()
    kh = tmp_path / "my_known_hosts"
    kh.write_text(f"[{sshd.address}]:{sshd.port} {old[0]} {old[1]}\n")
    with pytest.raises(HostKeyError, match="CHANGED") as info:
        sshd.host(known_hosts=str(kh))
    name = f"[{sshd.address}]:{sshd.port}"
    fix = f"ssh-keygen -f {kh} -R '{name}' && ssh-keyscan -p {sshd.port} {sshd.address} >> {kh}"
    assert fix in str(info.value)
    subprocess.run(fix, shell=True, check=True, capture_output=True, timeout=30)  # the advice, as given, works
    host = sshd.host(known_hosts=str(kh))
    assert host.run(["echo", "ok"]).stdout == "ok\n"


@pytest.mark.ssh
def test_an_unknown_host_key_advises_the_known_hosts_file_given(sshd: SshdServer, tmp_path: Path) -> None:
    empty = tmp_path / "kh"
    empty.write_text("")
    with pytest.raises(HostKeyError) as info:
        sshd.host(known_hosts=str(empty))
    assert f"ssh-keyscan -p {sshd.port} {sshd.address} >> {empty}" in str(info.value)


@pytest.mark.ssh
def test_the_record_gets_the_key_and_host_key_fingerprints(sshd: SshdServer, tmp_path: Path) -> None:
    host = sshd.host()
    ident = host.ssh_identity()
    assert ident.host_key_type == "ssh-ed25519"
    assert ident.host_key_sha256 == sha256_of(sshd.host_key_pub, tmp_path)
    assert ident.key_filenames == [sshd.key_filename]
    assert ident.key_sha256 == [sha256_of(Path(f"{sshd.key_filename}.pub").read_text(), tmp_path)]
    assert ident.known_hosts == [sshd.known_hosts]
    assert json.loads(ident.model_dump_json())["host_key_sha256"].startswith("SHA256:")


@contextlib.contextmanager
def sshd_without_sftp(sshd: SshdServer, tmp_path: Path) -> Iterator[int]:
    """One more sshd, the fixture's config less its `Subsystem sftp` line (same host key and users)."""
    port = free_port()
    lines = [ln for ln in (sshd.workdir / "sshd_config").read_text().splitlines() if not ln.startswith("Subsystem")]
    lines = [f"Port {port}" if ln.startswith("Port ") else f"PidFile {tmp_path / 'sshd.pid'}"
             if ln.startswith("PidFile ") else ln for ln in lines]
    (tmp_path / "sshd_config").write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([str(SSHD), "-D", "-f", str(tmp_path / "sshd_config"), "-E", str(tmp_path / "log")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection((sshd.address, port), 0.5):
                break
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.ssh
def test_a_host_without_sftp_says_what_to_add_to_sshd_config(sshd: SshdServer, tmp_path: Path) -> None:
    with sshd_without_sftp(sshd, tmp_path) as port:
        kh = tmp_path / "known_hosts"
        kh.write_text(f"[{sshd.address}]:{port} {sshd.host_key_pub}\n")
        host = SSHHost.from_spec(f"ssh://{sshd.user}@{sshd.address}:{port}", key_filename=sshd.key_filename,
                                 known_hosts=str(kh))
        try:
            assert host.run(["echo", "up"]).stdout == "up\n"  # commands work; only files need SFTP
            t0 = time.monotonic()
            with pytest.raises(HostError) as info:
                host.write_text(str(tmp_path / "x.txt"), "data")
            assert time.monotonic() - t0 < 5 and not info.value.lost
            msg = str(info.value)
            assert msg.startswith(f"on {host.name}: failed: open an SFTP session")
            assert "Subsystem sftp internal-sftp" in info.value.hint and "sshd_config" in info.value.hint
            assert "tiny models" in info.value.hint and "exit None" not in msg
            assert host.run(["echo", "still"]).stdout == "still\n"  # the connection is fine
        finally:
            host.close()
        # the same through a trial, which uploads spectrial's llama.cpp build and tiny models there
        res = cli("trial", "params/local.yaml", "-p", f"host=ssh://{sshd.user}@{sshd.address}:{port}",
                  "-p", f"ssh.key_filename={sshd.key_filename}", "-p", f"ssh.known_hosts={kh}",
                  "-p", f"ssh.cache_dir={tmp_path / 'remote-cache'}", "-p", f"work_dir={tmp_path / 'work'}",
                  "-p", f"state_dir={tmp_path / 'state'}", "--output-dir", str(tmp_path / "out"), "--quiet")
        assert res.returncode in (1, 2) and "Traceback" not in res.stderr, res.stderr[-3000:]
        assert "open an SFTP session" in res.stderr and "Subsystem sftp internal-sftp" in res.stderr
    assert not os.path.exists(tmp_path / "x.txt")
