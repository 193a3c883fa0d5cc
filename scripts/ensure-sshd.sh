#!/usr/bin/env bash
# Make sure an OpenSSH server binary (/usr/sbin/sshd) exists, for the `ssh` tests (tests/sshd_plugin.py).
#
# Idempotent: does nothing when sshd is already there. Otherwise, as root on Debian/Ubuntu, installs
# `openssh-server` without recommends. The package's postinst would start the system service: a
# policy-rc.d that exits 101 forbids that during the install (an existing policy-rc.d is left alone).
# The system sshd configuration is never touched and no service is started; the tests run their own
# sshd on loopback with their own config.
#
# Exit status: 0 when sshd is available at the end, 1 when it is not (with a message saying why).
set -euo pipefail

SSHD=${SSHD:-/usr/sbin/sshd}

say() { printf 'ensure-sshd: %s\n' "$*"; }

if [ -x "$SSHD" ]; then
    say "found $SSHD ($("$SSHD" -V 2>&1 | head -n1 || true)); nothing to do"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    say "$SSHD is missing and this is not root: install it yourself (Debian/Ubuntu:"
    say "  sudo apt-get install -y --no-install-recommends openssh-server) or the ssh tests are skipped"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "$SSHD is missing and apt-get is not available: install an OpenSSH server by hand"
    exit 1
fi

. "$(dirname "$0")/apt-install-no-service.sh"
apt_install_no_service openssh-server

if [ -x "$SSHD" ]; then
    say "installed $SSHD ($("$SSHD" -V 2>&1 | head -n1 || true))"
    exit 0
fi
say "openssh-server is installed but $SSHD is still missing"
exit 1
