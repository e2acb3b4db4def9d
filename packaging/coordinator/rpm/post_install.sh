# clawfleet-coordinator %post ($1: 1 on install, 2 on upgrade). Idempotent.
# Creates the system user `clawfleet` (kept if it exists), then, like %systemd_post, applies
# the distribution's preset on first install (RHEL/Fedora presets leave new services
# disabled: `systemctl enable --now clawfleet-coordinator` starts it). ExecStartPre runs
# `occ init`, which creates the keys and the first admin token only when missing.
if [ ! -d /etc/clawfleet ]; then
    install -d -m 0755 -o root -g root /etc/clawfleet
fi
systemd-sysusers /usr/lib/sysusers.d/clawfleet-coordinator.conf >/dev/null 2>&1 || :
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" = 1 ]; then
    systemctl --no-reload preset clawfleet-coordinator.service >/dev/null 2>&1 || :
fi
exit 0
