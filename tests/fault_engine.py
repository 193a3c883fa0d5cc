"""An engine binary for the hostile-server trial tests: runs the real llama-server one port up and the fault proxy
(tests/fault_proxy.py) on the port spectrial gave it, so a trial measures its own real server through a fault.

    fault_engine.py --real /path/llama-server --fault /v1/completions=endless -- <llama-server argv...>

spectrial starts it as `engine_bin` (a small shell script in the test's tmp folder execs it with the real binary
and the fault): the server's argv arrives after `--`; `--port P` becomes `--port P+1` for llama-server, and the
proxy listens on P. Both are in spectrial's process group and session, so its stop ends them as it ends a server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_proxy import FaultProxy  # noqa: E402


def main() -> None:
    args = sys.argv[1:]
    real = args[args.index("--real") + 1]
    faults = dict(f.split("=", 1) for i, f in enumerate(args) if i > 0 and args[i - 1] == "--fault")
    argv = args[args.index("--") + 1:] if "--" in args else []
    if "--port" not in argv:  # --version, --help: the real binary answers
        os.execv(real, [real, *argv])
    port = int(argv[argv.index("--port") + 1])
    argv[argv.index("--port") + 1] = str(port + 1)
    child = subprocess.Popen([real, *argv])
    proxy = FaultProxy(port + 1, faults, port=port).start()

    def stop(signum: int, _frame: object) -> None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
        proxy.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
