# clawfleet-coordinator %postun ($1: 0 on erase, 1 on upgrade/downgrade), like
# %systemd_postun_with_restart: restart on the new binary after an upgrade or downgrade.
#
# THE RULE (docs/operator-guide.md, "Uninstall"): erase removes what the package created
# (/usr/bin/occ, the unit, the sysusers.d entry, an unmodified /etc/clawfleet/occ.toml, and
# /etc/clawfleet only when empty). It never removes /var/lib/clawfleet-coordinator (database,
# keys, admin token) or the `clawfleet` account.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -ge 1 ] 2>/dev/null; then
    systemctl try-restart clawfleet-coordinator.service >/dev/null 2>&1 || :
fi
if [ "$1" = 0 ]; then
    rmdir /etc/clawfleet 2>/dev/null || :
fi
exit 0
