#!/usr/bin/env python3
"""Builds one clawfleet .deb or .rpm with the distribution's own tools (dpkg-deb, rpmbuild)
from the crate's `[package.metadata.deb]` / `[package.metadata.generate-rpm]` in its
Cargo.toml, so no cargo plugin has to be compiled first (that took ~20 minutes on a cold CI
machine). Only the keys clawfleet uses are understood; any other key is an error, so the
metadata cannot silently say something this script ignores.

    mkpkg.py deb CRATE_DIR OUT_DIR [--deb-version V-R]
    mkpkg.py rpm CRATE_DIR OUT_DIR [--release R]
    mkpkg.py debhelper SCRIPT        (test aid: prints SCRIPT with its #DEBHELPER# line
                                      replaced by GENERATED, or the error)

Paths in the metadata are relative to the crate directory, except `target/...`, which means
the cargo target directory (CARGO_TARGET_DIR, default <workspace>/target), as cargo-deb and
cargo-generate-rpm read them. File dates come from SOURCE_DATE_EPOCH when it is set.
"""

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import tomllib
from pathlib import Path

DEB_KEYS = {
    "name", "maintainer", "copyright", "section", "priority", "extended-description",
    "depends", "changelog", "maintainer-scripts", "assets", "conf-files", "systemd-units",
}
RPM_KEYS = {
    "name", "summary", "url", "release", "assets", "requires", "post_install_script",
    "pre_uninstall_script", "post_uninstall_script",
}
MARKER = "#DEBHELPER#"


class PackagingError(Exception):
    pass


def load(crate_dir: Path):
    """The crate's package table and the workspace's, with inherited fields resolved."""
    crate = tomllib.loads((crate_dir / "Cargo.toml").read_text())
    workspace_dir = crate_dir.parent
    ws = tomllib.loads((workspace_dir / "Cargo.toml").read_text())
    ws_pkg = ws.get("workspace", {}).get("package", {})
    pkg = dict(crate["package"])
    for key, value in list(pkg.items()):
        if isinstance(value, dict) and value.get("workspace") is True:
            if key not in ws_pkg:
                raise PackagingError(f"{crate_dir}/Cargo.toml: {key}.workspace but the workspace has no {key}")
            pkg[key] = ws_pkg[key]
    return pkg, workspace_dir


def target_dir(workspace_dir: Path) -> Path:
    t = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    return t if t.is_absolute() else workspace_dir / t


def source_path(crate_dir: Path, workspace_dir: Path, src: str) -> Path:
    if src.startswith("target/"):
        return target_dir(workspace_dir) / src[len("target/"):]
    return (crate_dir / src).resolve()


def check_keys(table: dict, allowed: set, where: str):
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise PackagingError(f"{where}: keys this script does not handle: {', '.join(unknown)}")


def epoch():
    v = os.environ.get("SOURCE_DATE_EPOCH")
    return int(v) if v else None


def put(src: Path, dest: Path, mode: int):
    if not src.is_file():
        raise PackagingError(f"asset {src} does not exist (build it first)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    os.chmod(dest, mode)


def write(dest: Path, data: bytes, mode: int):
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    os.chmod(dest, mode)


def clamp_times(root: Path):
    t = epoch()
    if t is None:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames + dirnames:
            os.utime(Path(dirpath) / n, (t, t), follow_symlinks=False)
    os.utime(root, (t, t))


def gzip_n(data: bytes) -> bytes:
    """gzip -9n: no name, no time stamp, so the same input gives the same bytes."""
    return gzip.compress(data, compresslevel=9, mtime=0)


# ---- .deb ---------------------------------------------------------------------------------

def systemd_snippets(units: list, sysusers: list):
    """The maintainer-script parts dh_installsysusers and dh_installsystemd (debhelper 13)
    generate for `enable = true, start = true, restart-after-upgrade = true`, per script.
    Each appears exactly once in the script that gets it."""
    q = " ".join(f"'{u}'" for u in units)
    post = []
    for conf in sysusers:
        post.append(
            "# Automatically added by packaging/mkpkg.py (as dh_installsysusers)\n"
            'if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then\n'
            f'\tsystemd-sysusers ${{DPKG_ROOT:+--root="$DPKG_ROOT"}} {conf}\n'
            "fi\n"
            "# End automatically added section\n"
        )
    prerm, postrm = [], []
    if units:
        for u in units:
            post.append(
                "# Automatically added by packaging/mkpkg.py (as dh_installsystemd)\n"
                'if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then\n'
                "\t# This will only remove masks created by d-s-h on package removal.\n"
                f"\tdeb-systemd-helper unmask '{u}' >/dev/null || true\n"
                "\n"
                "\t# was-enabled defaults to true, so new installations run enable.\n"
                f"\tif deb-systemd-helper --quiet was-enabled '{u}'; then\n"
                "\t\t# Enables the unit on first installation, creates new\n"
                "\t\t# symlinks on upgrades if the unit file has changed.\n"
                f"\t\tdeb-systemd-helper enable '{u}' >/dev/null || true\n"
                "\telse\n"
                "\t\t# Update the statefile to add new symlinks (if any), which need to be\n"
                "\t\t# cleaned up on purge. Also remove old symlinks.\n"
                f"\t\tdeb-systemd-helper update-state '{u}' >/dev/null || true\n"
                "\tfi\n"
                "fi\n"
                "# End automatically added section\n"
            )
        post.append(
            "# Automatically added by packaging/mkpkg.py (as dh_installsystemd)\n"
            'if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then\n'
            "\tif [ -d /run/systemd/system ]; then\n"
            "\t\tsystemctl --system daemon-reload >/dev/null || true\n"
            '\t\tif [ -n "$2" ]; then\n'
            "\t\t\t_dh_action=restart\n"
            "\t\telse\n"
            "\t\t\t_dh_action=start\n"
            "\t\tfi\n"
            f"\t\tdeb-systemd-invoke $_dh_action {q} >/dev/null || true\n"
            "\tfi\n"
            "fi\n"
            "# End automatically added section\n"
        )
        # restart-after-upgrade: stopped only on remove; an upgrade restarts it in postinst.
        prerm.append(
            "# Automatically added by packaging/mkpkg.py (as dh_installsystemd)\n"
            'if [ -z "${DPKG_ROOT:-}" ] && [ "$1" = remove ] && [ -d /run/systemd/system ] ; then\n'
            f"\tdeb-systemd-invoke stop {q} >/dev/null || true\n"
            "fi\n"
            "# End automatically added section\n"
        )
        postrm.append(
            "# Automatically added by packaging/mkpkg.py (as dh_installsystemd)\n"
            'if [ -d /run/systemd/system ] && [ "$1" = remove ]; then\n'
            "\tsystemctl --system daemon-reload >/dev/null || true\n"
            "fi\n"
            "# End automatically added section\n"
        )
        postrm.append(
            "# Automatically added by packaging/mkpkg.py (as dh_installsystemd)\n"
            'if [ "$1" = "remove" ]; then\n'
            '\tif [ -x "/usr/bin/deb-systemd-helper" ]; then\n'
            f"\t\tdeb-systemd-helper mask {q} >/dev/null || true\n"
            "\tfi\n"
            "fi\n"
            "\n"
            'if [ "$1" = "purge" ]; then\n'
            '\tif [ -x "/usr/bin/deb-systemd-helper" ]; then\n'
            f"\t\tdeb-systemd-helper purge {q} >/dev/null || true\n"
            f"\t\tdeb-systemd-helper unmask {q} >/dev/null || true\n"
            "\tfi\n"
            "fi\n"
            "# End automatically added section\n"
        )
    return {"postinst": post, "prerm": prerm, "postrm": postrm}


def fill_debhelper(name: str, text: str, snippets: list) -> str:
    """Replaces the one line that is exactly `#DEBHELPER#` with the generated parts. The
    marker anywhere else (in a comment, after a command) is an error: a tool that replaces
    every occurrence would put the generated code there too (a comment that swallows its
    first line, the rest run twice)."""
    lines = text.splitlines(keepends=True)
    at = [i for i, l in enumerate(lines) if l.strip() == MARKER]
    stray = [i + 1 for i, l in enumerate(lines) if MARKER in l and l.strip() != MARKER]
    if stray:
        raise PackagingError(
            f"{name}: {MARKER} on line(s) {stray} is not alone on its line; write it only as "
            "the line where the generated part goes (not in a comment)"
        )
    if len(at) > 1:
        raise PackagingError(f"{name}: {MARKER} appears {len(at)} times; it must appear once")
    if not at:
        if snippets:
            raise PackagingError(f"{name}: has no {MARKER} line for the generated part")
        return text
    lines[at[0]] = "".join(snippets)
    return "".join(lines)


def wrap_description(text: str) -> str:
    out = []
    for para in text.strip().split("\n\n"):
        para = " ".join(para.split())
        out.extend(" " + l for l in textwrap.wrap(para, 78, break_on_hyphens=False))
        out.append(" .")
    return "\n".join(out[:-1])


def shlib_depends(root: Path, elves: list) -> str:
    """`$auto`: dpkg-shlibdeps on the package's ELF files (libc6 (>= x.y), ...)."""
    if not elves:
        return ""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "debian").mkdir()
        (Path(d) / "debian/control").write_text("Source: x\n\nPackage: x\nArchitecture: any\n")
        cmd = ["dpkg-shlibdeps", "-O", "--warnings=0"] + [f"-e{e}" for e in elves]
        r = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    if r.returncode != 0:
        raise PackagingError(f"dpkg-shlibdeps failed (apt-get install dpkg-dev): {r.stderr.strip()}")
    for line in r.stdout.splitlines():
        if line.startswith("shlibs:Depends="):
            return line.split("=", 1)[1].strip()
    return ""


def is_elf(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(4) == b"\x7fELF"


def build_deb(crate_dir: Path, out: Path, deb_version: str | None) -> Path:
    pkg, ws = load(crate_dir)
    meta = pkg.get("metadata", {}).get("deb")
    if meta is None:
        raise PackagingError(f"{crate_dir}/Cargo.toml has no [package.metadata.deb]")
    where = f"{crate_dir}/Cargo.toml [package.metadata.deb]"
    check_keys(meta, DEB_KEYS, where)
    name = meta.get("name", pkg["name"])
    version = deb_version or f"{pkg['version']}-1"
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix=f"mkpkg-{name}-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir(mode=0o755)
        elves = []
        for asset in meta.get("assets", []):
            src, dest, mode = asset
            s = source_path(crate_dir, ws, src)
            d = dest + s.name if dest.endswith("/") else dest
            target = root / d.lstrip("/")
            put(s, target, int(mode, 8))
            if is_elf(target):
                elves.append(str(target))
        doc = root / "usr/share/doc" / name
        if "changelog" in meta:
            changelog = (crate_dir / meta["changelog"]).read_bytes()
            write(doc / "changelog.Debian.gz", gzip_n(changelog), 0o644)
        write(doc / "copyright", (
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
            f"Upstream-Name: {name}\n"
            + (f"Source: {pkg['repository']}\n" if "repository" in pkg else "")
            + "\nFiles: *\n"
            f"Copyright: {meta.get('copyright', ', '.join(pkg.get('authors', [])))}\n"
            f"License: {pkg['license']}\n"
            + (" On Debian systems, the full text of the Apache License, Version 2.0 is in\n"
               " /usr/share/common-licenses/Apache-2.0.\n" if pkg["license"] == "Apache-2.0" else "")
        ).encode(), 0o644)

        units, sysusers = [], []
        su = meta.get("systemd-units")
        if su is not None:
            check_keys(su, {"unit-scripts", "enable", "start", "restart-after-upgrade"},
                       f"{where} systemd-units")
            if not (su.get("enable") and su.get("start") and su.get("restart-after-upgrade")):
                raise PackagingError(f"{where} systemd-units: only enable = start = "
                                     "restart-after-upgrade = true is implemented")
            unit_dir = crate_dir / su["unit-scripts"]
            for f in sorted(unit_dir.iterdir()):
                if f.name.startswith(name + ".") and f.suffix in (".service", ".socket", ".timer"):
                    put(f, root / "usr/lib/systemd/system" / f.name, 0o644)
                    units.append(f.name)
                elif f.name == name + ".sysusers":
                    put(f, root / "usr/lib/sysusers.d" / f"{name}.conf", 0o644)
                    sysusers.append(f"{name}.conf")
            if not units:
                raise PackagingError(f"{unit_dir}: no {name}.service")
        snippets = systemd_snippets(units, sysusers)

        control_dir = root / "DEBIAN"
        control_dir.mkdir(mode=0o755)
        scripts_dir = (crate_dir / meta["maintainer-scripts"]).resolve() if "maintainer-scripts" in meta else None
        for script in ("preinst", "postinst", "prerm", "postrm"):
            path = scripts_dir / script if scripts_dir else None
            parts = snippets.get(script, [])
            if path and path.is_file():
                text = fill_debhelper(str(path), path.read_text(), parts)
            elif parts:
                text = "#!/bin/sh\nset -e\n" + "".join(parts)
            else:
                continue
            write(control_dir / script, text.encode(), 0o755)

        conffiles = meta.get("conf-files", [])
        for c in conffiles:
            if not (root / c.lstrip("/")).is_file():
                raise PackagingError(f"{where} conf-files: {c} is not among the assets")
        if conffiles:
            write(control_dir / "conffiles", "".join(c + "\n" for c in conffiles).encode(), 0o644)

        sums, size_kb = [], 0
        for dirpath, dirnames, filenames in sorted(os.walk(root)):
            rel = Path(dirpath).relative_to(root)
            if rel.parts[:1] == ("DEBIAN",):
                continue
            size_kb += len(dirnames)
            for f in sorted(filenames):
                p = Path(dirpath) / f
                data = p.read_bytes()
                size_kb += (len(data) + 1023) // 1024
                sums.append(f"{hashlib.md5(data).hexdigest()}  {(rel / f).as_posix()}\n")
        write(control_dir / "md5sums", "".join(sorted(sums, key=lambda l: l[34:])).encode(), 0o644)

        depends = []
        for d in [x.strip() for x in meta.get("depends", "").split(",") if x.strip()]:
            if d == "$auto":
                auto = shlib_depends(root, elves)
                if auto:
                    depends.append(auto)
            else:
                depends.append(d)
        control = [
            f"Package: {name}",
            f"Version: {version}",
            f"Architecture: {arch}",
            f"Maintainer: {meta['maintainer']}",
            f"Installed-Size: {size_kb}",
        ]
        if depends:
            control.append(f"Depends: {', '.join(depends)}")
        control += [f"Section: {meta.get('section', 'misc')}", f"Priority: {meta.get('priority', 'optional')}"]
        if "repository" in pkg:
            control.append(f"Homepage: {pkg['repository']}")
        control.append(f"Description: {pkg['description']}")
        if "extended-description" in meta:
            control.append(wrap_description(meta["extended-description"]))
        write(control_dir / "control", ("\n".join(control) + "\n").encode(), 0o644)

        clamp_times(root)
        out.mkdir(parents=True, exist_ok=True)
        deb = out / f"{name}_{version}_{arch}.deb"
        r = subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise PackagingError(f"dpkg-deb --build: {r.stderr.strip()}")
    return deb


# ---- .rpm ---------------------------------------------------------------------------------

def build_rpm(crate_dir: Path, out: Path, release: str | None) -> Path:
    pkg, ws = load(crate_dir)
    meta = pkg.get("metadata", {}).get("generate-rpm")
    if meta is None:
        raise PackagingError(f"{crate_dir}/Cargo.toml has no [package.metadata.generate-rpm]")
    where = f"{crate_dir}/Cargo.toml [package.metadata.generate-rpm]"
    check_keys(meta, RPM_KEYS, where)
    name = meta.get("name", pkg["name"])
    release = release or str(meta.get("release", "1"))
    version = pkg["version"]
    if shutil.which("rpmbuild") is None:
        raise PackagingError("rpmbuild not found (apt-get install rpm)")
    with tempfile.TemporaryDirectory(prefix=f"mkpkg-{name}-") as tmp:
        tmp = Path(tmp)
        stage = tmp / "stage"
        files = []
        for a in meta.get("assets", []):
            check_keys(a, {"source", "dest", "mode", "config", "doc"}, f"{where} assets")
            s = source_path(crate_dir, ws, a["source"])
            put(s, stage / a["dest"].lstrip("/"), int(a["mode"], 8))
            line = f"%attr({a['mode']},root,root) {a['dest']}"
            if a.get("config") == "noreplace":
                line = "%config(noreplace) " + line
            elif a.get("config"):
                line = "%config " + line
            if a.get("doc"):
                line = "%doc " + line
            files.append(line)
        clamp_times(stage)
        spec = [
            f"Name: {name}",
            f"Version: {version}",
            f"Release: {release}",
            f"Summary: {meta.get('summary', pkg['description'])}",
            f"License: {pkg['license']}",
        ]
        if "url" in meta:
            spec.append(f"URL: {meta['url']}")
        for req, ver in meta.get("requires", {}).items():
            spec.append(f"Requires: {req}" if ver == "*" else f"Requires: {req} {ver}")
        spec += ["", "%description", pkg["description"], "", "%install",
                 f'cp -a "{stage}/." "%{{buildroot}}/"', ""]
        for key, section in (("post_install_script", "%post"),
                             ("pre_uninstall_script", "%preun"),
                             ("post_uninstall_script", "%postun")):
            if key in meta:
                spec += [section, (crate_dir / meta[key]).read_text().rstrip("\n"), ""]
        spec += ["%files"] + files + [""]
        (tmp / "pkg.spec").write_text("\n".join(spec))
        defines = {
            "_topdir": str(tmp / "rpmbuild"),
            "_build_id_links": "none",
            "debug_package": "%{nil}",
            "__os_install_post": "%{nil}",
            "_binary_payload": "w6.xzdio",
            "_buildhost": "clawfleet-build",
        }
        if epoch() is not None:
            defines["use_source_date_epoch_as_buildtime"] = "1"
            defines["clamp_mtime_to_source_date_epoch"] = "1"
        cmd = ["rpmbuild", "-bb", "--quiet", "--target", "x86_64-linux", "--nodeps"]
        for k, v in defines.items():
            cmd += ["--define", f"{k} {v}"]
        cmd.append(str(tmp / "pkg.spec"))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise PackagingError(f"rpmbuild failed:\n{r.stdout}{r.stderr}")
        built = list((tmp / "rpmbuild/RPMS").rglob("*.rpm"))
        if len(built) != 1:
            raise PackagingError(f"rpmbuild made {built}, expected one package")
        out.mkdir(parents=True, exist_ok=True)
        dest = out / built[0].name
        shutil.move(built[0], dest)
    return dest


def main(argv):
    try:
        if len(argv) >= 2 and argv[0] == "debhelper":
            sys.stdout.write(fill_debhelper(argv[1], Path(argv[1]).read_text(), ["GENERATED\n"]))
            return 0
        if len(argv) not in (3, 5) or argv[0] not in ("deb", "rpm"):
            raise PackagingError(__doc__.split("\n\n")[1])
        kind, crate, out = argv[0], Path(argv[1]).resolve(), Path(argv[2]).resolve()
        extra = None
        if len(argv) == 5:
            flag = "--deb-version" if kind == "deb" else "--release"
            if argv[3] != flag:
                raise PackagingError(f"{kind}: expected {flag}, got {argv[3]}")
            extra = argv[4]
        made = build_deb(crate, out, extra) if kind == "deb" else build_rpm(crate, out, extra)
        print(made)
        return 0
    except PackagingError as e:
        print(f"mkpkg: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
