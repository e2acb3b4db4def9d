# clawfleet-coordinator %preun ($1: 0 on erase, 1 on upgrade/downgrade), like %systemd_preun:
# on erase, disable and stop the service; on upgrade leave it running.
if [ "$1" = 0 ]; then
    systemctl --no-reload disable --now clawfleet-coordinator.service >/dev/null 2>&1 || :
fi
exit 0
