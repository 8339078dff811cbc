#!/usr/bin/env bash
# The command line: --check on good and bad configurations, --version, --help, hash-token.
. "$AGW_SRCDIR/tests/integration/lib.sh"

# check_config NAME JSON EXPECTED_EXIT NEEDLE
check_config() {
    printf '%s\n' "$2" >"$T/$1.json"
    local out st
    out=$("$AGW_GATEWAY" --check -c "$T/$1.json" 2>&1)
    st=$?
    check_eq "--check $1: exit status" "$3" "$st"
    check_contains "--check $1: message" "$4" "$out"
}

out=$("$AGW_GATEWAY" --check -c "$AGW_SRCDIR/conf/agui-gateway.example.json" 2>&1)
check_eq "--check the example configuration" 0 $?
check_contains "--check says valid" "valid" "$out"

base='"listen":[{"address":"127.0.0.1","port":0}],"auth":{"mode":"none"}'
check_config minimal "{$base,\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9/x\"]}}}" 0 "valid"
check_config unknown_key "{$base,\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9/x\"]}},\"bogus\":1}" 1 "bogus"
check_config unknown_nested "{$base,\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9/x\"],\"colour\":\"red\"}}}" 1 "agents.a.colour"
check_config bad_url "{$base,\"agents\":{\"weather\":{\"upstreams\":[\"foo\"]}}}" 1 "agents.weather.upstreams[0]"
check_config bad_duration "{$base,\"agents\":{\"a\":{\"upstreams\":[\"http://127.0.0.1:9/x\"]}},\"timeouts\":{\"connect\":\"abc\"}}" 1 "timeouts.connect"
check_config no_auth '{"listen":[{"address":"127.0.0.1","port":0}],"agents":{"a":{"upstreams":["http://127.0.0.1:9/x"]}}}' 1 "auth"
check_config syntax '{"listen": [' 1 "line"

out=$("$AGW_GATEWAY" --check -c "$T/does-not-exist.json" 2>&1)
check_eq "--check a missing file fails" 1 $?
check_contains "--check a missing file names it" "does-not-exist.json" "$out"

out=$("$AGW_GATEWAY" --version)
check_contains "--version" "agui-gateway " "$out"
out=$("$AGW_GATEWAY" --help)
check_contains "--help" "Usage:" "$out"
"$AGW_GATEWAY" --no-such-flag >/dev/null 2>&1
check_eq "unknown flag exits 2" 2 $?

out=$(printf 'demo-token\n' | "$AGW_GATEWAY" hash-token)
check_eq "hash-token prints the SHA-256" "$(printf %s demo-token | sha256sum | cut -d' ' -f1)" "$out"

finish
