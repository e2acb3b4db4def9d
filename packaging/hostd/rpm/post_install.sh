# clawfleet-hostd %post ($1: 1 on install, 2 on upgrade). Idempotent.
# hostd has no daemon: nothing of hostd is started, enabled or restarted (sshd is reloaded
# for the package's drop-in). Agent units run the gateway,
# not hostd, so replacing /usr/sbin/hostd never interrupts a serving Agent.
if [ ! -d /etc/clawfleet ]; then
    install -d -m 0755 -o root -g root /etc/clawfleet
fi
# The state root: created 0755 root when missing; an existing one is left as it is.
if [ ! -d /var/lib/clawfleet ]; then
    install -d -m 0755 -o root -g root /var/lib/clawfleet
fi
# sshd reads /etc/ssh/sshd_config.d/clawfleet-hostd.conf (DenyUsers cfa-*: Agent accounts
# never log in) from its next reload; an sshd that is not running reads it when it starts.
# reload-sshd returns once sshd listens again, so the next ssh connection is not refused.
/usr/lib/clawfleet-hostd/reload-sshd sshd.service || true
exit 0
