#!/usr/bin/env bash
# Make sure Slurm (slurmctld, slurmd, sbatch & co.) and MUNGE (munged) exist, for the `slurm` tests
# (tests/slurm_plugin.py runs a private one-node cluster from tests/slurm/).
#
# Idempotent: does nothing when sbatch, slurmctld, slurmd and munged are already there. Otherwise, as root on
# Debian/Ubuntu, installs `slurm-wlm` and `munge` without recommends. Their postinst scripts would start the
# system services (munge, slurmctld, slurmd): a policy-rc.d that exits 101 forbids that during the install
# (an existing policy-rc.d is left alone). The system Slurm/MUNGE configuration is never touched and no
# service is started; the tests run their own daemons with their own config, key and socket.
#
# Exit status: 0 when all four binaries are available at the end, 1 when they are not (with a message
# saying why).
set -euo pipefail

PACKAGES=(slurm-wlm munge)
NEEDED=(sbatch slurmctld slurmd munged)

say() { printf 'ensure-slurm: %s\n' "$*"; }

# sbin is not always on a non-root PATH
export PATH="$PATH:/usr/sbin:/sbin"

missing() {
    local m=() b
    for b in "${NEEDED[@]}"; do
        command -v "$b" >/dev/null 2>&1 || m+=("$b")
    done
    printf '%s' "${m[*]:-}"
}

if [ -z "$(missing)" ]; then
    say "found $(command -v sbatch) and slurmctld ($(slurmctld -V 2>/dev/null | head -n1 || true)) and $(command -v munged); nothing to do"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    say "missing: $(missing), and this is not root: install them yourself (Debian/Ubuntu:"
    say "  sudo apt-get install -y --no-install-recommends ${PACKAGES[*]}) or the slurm tests are skipped"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "missing: $(missing), and apt-get is not available: install Slurm and MUNGE by hand"
    exit 1
fi

. "$(dirname "$0")/apt-install-no-service.sh"
apt_install_no_service "${PACKAGES[@]}"

if [ -z "$(missing)" ]; then
    say "installed $(command -v sbatch) and slurmctld ($(slurmctld -V 2>/dev/null | head -n1 || true)) and $(command -v munged)"
    exit 0
fi
say "${PACKAGES[*]} are installed but these are still missing: $(missing)"
exit 1
