# clawfleet-hostd %post ($1: 1 on install, 2 on upgrade). Idempotent.
# hostd has no daemon: nothing is started, enabled or restarted. Agent units run the gateway,
# not hostd, so replacing /usr/sbin/hostd never interrupts a serving Agent.
if [ ! -d /etc/clawfleet ]; then
    install -d -m 0755 -o root -g root /etc/clawfleet
fi
# The state root: created 0755 root when missing; an existing one is left as it is.
if [ ! -d /var/lib/clawfleet ]; then
    install -d -m 0755 -o root -g root /var/lib/clawfleet
fi
exit 0
