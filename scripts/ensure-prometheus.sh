#!/usr/bin/env bash
# Make sure Prometheus (the server) and its Pushgateway exist, for the `prometheus` tests
# (tests/watch/prometheus_server.py runs a private Prometheus on loopback that scrapes the test's own llama-server,
# vLLM and Pushgateway; `spectrial watch --push-gateway` pushes its change points there).
#
# Idempotent: does nothing when `prometheus` and `prometheus-pushgateway` are already there. Otherwise, as root on Debian/Ubuntu, installs
# Debian's `prometheus` without recommends (no node exporter); its postinst would start the system service: a
# policy-rc.d that exits 101 forbids that during the install. The system configuration is never touched and no
# service is started; the tests run their own Prometheus with their own configuration and storage.
#
# Exit status: 0 when both are available at the end, 1 when it is not (with a message saying why).
set -euo pipefail

PACKAGES=(prometheus prometheus-pushgateway)
say() { printf 'ensure-prometheus: %s\n' "$*"; }
export PATH="$PATH:/usr/sbin:/sbin"

have() { command -v prometheus >/dev/null 2>&1 && command -v prometheus-pushgateway >/dev/null 2>&1; }
if have; then
    say "found $(command -v prometheus) ($(prometheus --version 2>&1 | head -n1)) and $(command -v prometheus-pushgateway); nothing to do"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    say "missing: ${PACKAGES[*]} (one of), and this is not root: install it yourself (Debian/Ubuntu:"
    say "  sudo apt-get install -y --no-install-recommends ${PACKAGES[*]}) or the prometheus tests are skipped"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "missing: prometheus, and apt-get is not available: install Prometheus by hand"
    exit 1
fi

. "$(dirname "$0")/apt-install-no-service.sh"
apt_install_no_service "${PACKAGES[@]}"

if have; then
    say "installed $(command -v prometheus) ($(prometheus --version 2>&1 | head -n1))"
    exit 0
fi
say "${PACKAGES[*]} is installed but a binary is still missing (prometheus, prometheus-pushgateway)"
exit 1
