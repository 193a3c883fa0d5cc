"""HTTP access lines of the servers' uvicorn (SGLang, vLLM): engine "http".

Kind ``access``: client ("127.0.0.1:41178"), method, path, status (e.g. 200, 503; NaN where a paste cut
it off), and where vLLM's prefix stands before it, process and pid. Both uvicorn's own form
(``INFO:     127.0.0.1:41178 - "GET /health HTTP/1.1" 503 Service Unavailable``) and vLLM's
(``(APIServer pid=17943) INFO  127.0.0.1:53300 "POST /v1/completions HTTP/1.1" 200 OK``).
"""

from __future__ import annotations

from spectrial.logs.formats import LineFormat
from spectrial.logs.registry import registry
from spectrial.logs.text import TS_ISO

SGLANG_TS = r"^\[(?P<timestamp>[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?)"
VLLM_TS = (r"(?:INFO|WARNING|WARN|DEBUG|ERROR|CRITICAL)\s+(?P<timestamp>[0-9]{2}-[0-9]{2} "
           r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?)")
PROCESS = r"\((?P<process>[A-Za-z][A-Za-z0-9_]*) pid=(?P<pid>[0-9]+)\)"

registry.add(LineFormat(
    "http", "access", ('HTTP/1.1"', 'HTTP/1.0"', 'HTTP/2"', 'HTTP/2.0"'),
    (SGLANG_TS, TS_ISO, VLLM_TS, PROCESS,
     r'\s(?P<client>[^\s"]+)(?: -)? "(?P<method>[A-Z]+) (?P<path>[^ "]*) HTTP/[0-9.]+"(?: (?P<status>[0-9]{3}))?'),
    types={"client": "str", "method": "str", "path": "str", "process": "str"},
    require=("method",),
    key_metrics=("status",),
))
