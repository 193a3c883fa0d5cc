# Sourced by scripts/ensure-*.sh: `apt_install_no_service PKG...` installs Debian/Ubuntu packages without
# recommends and without starting their services. Their postinst scripts would start system services (sshd,
# munge, slurmctld, ...): a policy-rc.d that exits 101 forbids that for the length of the install (an existing
# one is left alone, and governs). One `apt-get update` and a second try when the first install fails.
# The caller defines `say`; it has checked that it runs as root with apt-get.

apt_install_no_service() {
    local policy=/usr/sbin/policy-rc.d created=0 rc=0
    if [ -e "$policy" ]; then
        say "keeping the existing $policy (service starts during install are governed by it)"
    else
        printf '#!/bin/sh\n# written by spectrial scripts/apt-install-no-service.sh for the duration of an install\nexit 101\n' > "$policy"
        chmod 755 "$policy"
        created=1
        say "wrote a temporary $policy (exit 101) so the install starts no service"
    fi
    say "installing $* (apt-get install -y --no-install-recommends $*)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"; then
        say "install failed; refreshing the package lists (apt-get update) and trying once more"
        DEBIAN_FRONTEND=noninteractive apt-get update || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" || rc=$?
    fi
    if [ "$created" -eq 1 ]; then
        rm -f "$policy"
        say "removed the temporary $policy"
    fi
    return "$rc"
}
