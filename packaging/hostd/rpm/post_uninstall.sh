# clawfleet-hostd %postun ($1: 0 on erase, 1 on upgrade/downgrade). Idempotent.
#
# THE RULE (docs/operator-guide.md, "Uninstall"): erasing the package removes only what the
# package created: /usr/sbin/hostd, an unmodified /etc/clawfleet/hostd.toml (rpm keeps a
# modified one as hostd.toml.rpmsave), and the directories /var/lib/clawfleet and
# /etc/clawfleet only when they are empty. It never removes, stops or disables Agent state
# under /var/lib/clawfleet, accounts cfa-*, units clawfleet-agent-*.service,
# /etc/clawfleet/allowed_signers or the coordinator's line in root's authorized_keys.
if [ "$1" = 0 ]; then
    rmdir /var/lib/clawfleet 2>/dev/null || :
    rmdir /etc/clawfleet 2>/dev/null || :
fi
exit 0
