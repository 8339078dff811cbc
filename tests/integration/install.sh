#!/usr/bin/env bash
# make install (into a DESTDIR): the daemon and the demo agent, the man page agui-gateway(8) rendering without
# a warning, the hardened systemd unit pointing at the installed daemon and configuration (systemd-analyze
# verify when it can run), the configuration that passes --check and survives a reinstall, the documents; and
# make uninstall removing every file it put there.
. "$AGW_SRCDIR/tests/integration/lib.sh"

B=$AGW_BUILDDIR
R=$T/root
# make from inside make check: a make of its own, not a part of the parent's (its flags, its jobserver).
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory "$@"; }
var() { printf 'print-var:\n\t@echo $(%s)\n' "$1" | mk -C "$B" -f Makefile -f - print-var; }
bindir=$(var bindir) sysconfdir=$(var sysconfdir) mandir=$(var mandir) docdir=$(var docdir)
unitdir=$(var systemdsystemunitdir)
case "$bindir$sysconfdir$mandir$docdir$unitdir" in
/*) ;;
*) fail "cannot read the installation directories from $B/Makefile ('$bindir', '$unitdir')"; finish; exit 1 ;;
esac

mk -C "$B" install DESTDIR="$R" >"$T/install.out" 2>&1 || { cat "$T/install.out"; fail "make install"; finish; exit 1; }
for p in agui-gateway agui-demo-agent; do
    [ -x "$R$bindir/$p" ] && ok "$p installed in $bindir" || fail "$R$bindir/$p missing"
done
check_eq "the installed daemon runs" "agui-gateway $(sed -n 's/^PACKAGE_VERSION = //p' "$B/Makefile")" "$("$R$bindir/agui-gateway" --version)"

cfg=$R$sysconfdir/agui-gateway/agui-gateway.json
check_contains "the configuration is installed and valid" "configuration is valid" "$("$R$bindir/agui-gateway" --check -c "$cfg" 2>&1)"
check_contains "its store lives in the unit's state directory" '"path": "/var/lib/agui-gateway"' "$(cat "$cfg")"

man=$R$mandir/man8/agui-gateway.8
[ -f "$man" ] && ok "agui-gateway(8) installed" || fail "$man missing"
warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$man" 2>&1 >"$T/man.txt")
check_eq "the man page renders without a warning" "" "$warnings"
check_contains "with its signals" "SIGUSR1" "$(cat "$T/man.txt")"
check_contains "and the installed paths" "$sysconfdir/agui-gateway/agui-gateway.json" "$(cat "$T/man.txt")"

unit=$R$unitdir/agui-gateway.service
[ -f "$unit" ] && ok "the systemd unit installed in $unitdir" || fail "$unit missing"
for d in DynamicUser=yes NoNewPrivileges=yes ProtectSystem=strict AmbientCapabilities=CAP_NET_BIND_SERVICE \
    CapabilityBoundingSet=CAP_NET_BIND_SERVICE StateDirectory=agui-gateway 'ExecReload=/bin/kill -HUP $MAINPID'; do
    check_contains "the unit has $d" "$d" "$(cat "$unit")"
done
check_contains "it runs the installed daemon with the installed configuration" \
    "ExecStart=$bindir/agui-gateway -c $sysconfdir/agui-gateway/agui-gateway.json" "$(cat "$unit")"
if command -v systemd-analyze >/dev/null 2>&1; then
    # The unit names the final paths; the copy checked here names where DESTDIR put them.
    sed "s|$bindir/|$R$bindir/|g" "$unit" >"$T/agui-gateway.service"
    out=$(MANPATH="$R$mandir" systemd-analyze verify "$T/agui-gateway.service" 2>&1)
    check_eq "systemd-analyze verify finds nothing to say" "" "$out"
else
    echo "(systemd-analyze is not installed: the unit is checked by its lines only)"
fi
for f in operations.md configuration.md protocol.md agui-gateway.example.json; do
    [ -f "$R$docdir/$f" ] && ok "$f installed in $docdir" || fail "$R$docdir/$f missing"
done

# A reinstall keeps the operator's configuration and puts the new one beside it.
printf '\n' >>"$cfg"
sum=$(sha256sum <"$cfg")
mk -C "$B" install DESTDIR="$R" >"$T/install2.out" 2>&1 || fail "make install again"
check_eq "a reinstall keeps the configuration" "$sum" "$(sha256sum <"$cfg")"
[ -f "$cfg.dist" ] && ok "and installs the new one as agui-gateway.json.dist" || fail "no $cfg.dist"

mk -C "$B" uninstall DESTDIR="$R" >"$T/uninstall.out" 2>&1 || fail "make uninstall"
check_eq "make uninstall removes every file" "" "$(find "$R" -type f)"
finish
