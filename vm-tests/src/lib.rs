//! Real Linux test hosts: systemd as PID 1 and sshd, booted with systemd-nspawn.
