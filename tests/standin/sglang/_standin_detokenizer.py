"""TEST DOUBLE: the `sglang::detokenizer` process of the SGLang stand-in (see `sglang/launch_server.py`).

Spawned by the launcher like SGLang's detokenizer manager: it asks for SIGKILL on parent death, renames
itself with setproctitle (blanking the front of its /proc/<pid>/environ) and relays the scheduler's token
outputs to the launcher (the tokenizer manager). It logs nothing.
"""

from __future__ import annotations

from typing import Any

import setproctitle

from sglang._standin_common import dump_stacks_on_sigusr1, kill_itself_when_parent_died, reassign_own_env


def run_detokenizer_process(in_q: Any, out_q: Any) -> None:
    """Entry point: forward every message from the scheduler to the launcher, in order."""
    reassign_own_env()
    kill_itself_when_parent_died()
    setproctitle.setproctitle("sglang::detokenizer")
    dump_stacks_on_sigusr1()
    while True:
        out_q.put(in_q.get())
