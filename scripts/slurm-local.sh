#!/usr/bin/env bash
# Start, stop or print the env of the same one-node Slurm cluster the `slurm` tests use, outside pytest, to
# develop against a running cluster. The code path is the tests' own (tests/slurm_plugin.py: start_cluster).
#
#   scripts/slurm-local.sh start DIR   # start it in DIR (or find it running); prints `export SLURM_CONF=...`
#   scripts/slurm-local.sh env DIR     # print `export SLURM_CONF=DIR/etc/slurm.conf`
#   scripts/slurm-local.sh stop DIR    # cancel its jobs, stop its daemons by the pids recorded in DIR
#
# Then: eval "$(scripts/slurm-local.sh env DIR)"; sinfo; sbatch ...   Logs are in DIR/log. Needs root and
# scripts/ensure-slurm.sh (make slurm) to have installed Slurm and MUNGE. Keep DIR short (a unix socket
# lives in it).
set -euo pipefail

usage() { printf 'usage: %s start|stop|env DIR\n' "$0" >&2; exit 2; }
[ $# -eq 2 ] || usage
case "$1" in start|stop|env) ;; *) usage ;; esac

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || PY=python3
exec "$PY" "$REPO/tests/slurm_plugin.py" "$1" "$2"
