#!/bin/bash
# The `xesp` command as an operator uses it: sa/policy add, list, get, del, flush and batch
# against a database file (--db); bad input fails with a one-line error that says where, and
# changes nothing; keys stay hidden unless asked for; without --db and without a daemon, an
# error that names the socket tried, and no file is written.
#
# Usage: bash test_cli.sh XESP
set -u
XESP=${1:?usage: test_cli.sh XESP}
work=$(mktemp -d /tmp/xesp-cli.XXXXXX)
trap 'rm -rf "$work"' EXIT
DB=$work/db.conf
export XESP_SOCKET=$work/no-daemon.sock
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

KEY=0x00112233445566778899aabbccddeeff01020304
SA="src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1000 reqid 1 mode tunnel aead rfc4106(gcm(aes)) $KEY 128"

check "sa add succeeds" '"$XESP" sa --db "$DB" add $SA'
check "a duplicate is refused" '! "$XESP" sa --db "$DB" add $SA 2>"$work/err"'
check "with a one-line message" '[ "$(wc -l <"$work/err")" -eq 1 ] && grep -q "already exists" "$work/err"'
check "sa list shows the SA" '"$XESP" sa --db "$DB" list | grep -q "spi 0x0*1000"'
check "sa list hides the key" '! "$XESP" sa --db "$DB" list | grep -qi 00112233445566778899aabbccddeeff'
check "--show-keys shows it" '"$XESP" sa --db "$DB" list --show-keys | grep -qi 00112233445566778899aabbccddeeff'
check "the database is private" '[ "$(stat -c %a "$DB")" = 600 ]'
check "sa get finds it" '"$XESP" sa --db "$DB" get dst 192.0.2.2 spi 0x1000 | grep -q 192.0.2.1'
check "policy add" '"$XESP" policy --db "$DB" add src 10.1.0.0/16 dst 10.2.0.0/16 dir out tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 1 mode tunnel'
check "policy list" '"$XESP" policy --db "$DB" list | grep -q "10.1.0.0/16"'

cp "$DB" "$work/before"
check "unknown algorithm suggests the right one" \
    '! "$XESP" sa --db "$DB" add src 192.0.2.1 dst 192.0.2.2 proto esp spi 7 aead "gcm(aes)" $KEY 128 2>"$work/err" && grep -q "rfc4106(gcm(aes))" "$work/err"'
check "the key is not in the error" '! grep -qi 00112233445566778899aabbccddeeff "$work/err"'

cat >"$work/batch.conf" <<CONF
# two good lines, then a bad one: nothing may be applied
sa add src 192.0.2.2 dst 192.0.2.1 proto esp spi 0x2000 mode tunnel aead 'rfc4106(gcm(aes))' $KEY 128
policy add src 10.2.0.0/16 dst 10.1.0.0/16 dir fwd tmpl src 192.0.2.2 dst 192.0.2.1 proto esp mode tunnel
sa add src 192.0.2.2 dst 192.0.2.1 proto esp spi 0x2001 mode tunnel aead 'rfc4106(gcm(aes))' 0x1234 128
CONF
check "a bad batch fails" '! "$XESP" batch --db "$DB" "$work/batch.conf" 2>"$work/err"'
check "naming FILE:LINE" 'grep -q "batch.conf:4:" "$work/err" && [ "$(wc -l <"$work/err")" -eq 1 ]'
check "and changes nothing" 'cmp -s "$DB" "$work/before"'
sed -i '$d' "$work/batch.conf"
check "the good part applies" '"$XESP" batch --db "$DB" "$work/batch.conf" && "$XESP" sa --db "$DB" list | grep -c "spi" | grep -qx 2'
printf 'sa add src 192.0.2.9 dst 192.0.2.8 proto esp spi 0x3000 mode tunnel aead rfc4106(gcm(aes)) %s 128\n' "$KEY" >"$work/one.conf"
check "xesp -b FILE applies a batch, as ip -b" '"$XESP" --db "$DB" -b "$work/one.conf" && "$XESP" sa --db "$DB" get dst 192.0.2.8 spi 0x3000 >/dev/null'
check "xesp with no command prints help and fails" '! "$XESP" >/dev/null 2>&1'
check "sa del" '"$XESP" sa --db "$DB" del dst 192.0.2.1 spi 0x2000 && ! "$XESP" sa --db "$DB" get dst 192.0.2.1 spi 0x2000 2>/dev/null'
check "sa del of a missing SA fails" '! "$XESP" sa --db "$DB" del dst 192.0.2.1 spi 0x2000 2>/dev/null'
check "sa flush" '"$XESP" sa --db "$DB" flush && [ -z "$("$XESP" sa --db "$DB" list)" ]'
check "policy flush" '"$XESP" policy --db "$DB" flush && [ -z "$("$XESP" policy --db "$DB" list)" ]'

check "without --db and no daemon: an error" '! "$XESP" sa add $SA 2>"$work/err"'
check "naming the socket it tried" 'grep -q "no-daemon.sock" "$work/err" && [ "$(wc -l <"$work/err")" -eq 1 ]'
check "and the database is left alone" '[ -z "$("$XESP" sa list --db "$DB")" ]'
check "batch without --db: an error too" '! "$XESP" batch "$work/one.conf" 2>/dev/null'
check "xesp -b without --db: an error too" '! "$XESP" -b "$work/one.conf" 2>/dev/null'
check "policy list without --db: an error too" '! "$XESP" policy list 2>/dev/null'

# Two SAs with one key and salt (an in/out pair given one key) share the nonce space.
BACK="src 192.0.2.2 dst 192.0.2.1 proto esp spi 0x2000 reqid 2 mode tunnel aead rfc4106(gcm(aes)) $KEY 128"
check "sa add of a second SA with the same key and salt warns, on one line" \
    '"$XESP" sa --db "$DB" add $SA && "$XESP" sa --db "$DB" add $BACK 2>"$work/err" && [ "$(wc -l <"$work/err")" -eq 1 ] &&
     grep -q "^warning: SA dst 192.0.2.1 spi 0x00002000 has the same key and salt as SA dst 192.0.2.2 spi 0x00001000: nonce-reuse risk" "$work/err"'
check "the warning does not show the key" '! grep -qi 00112233445566778899aabbccddeeff "$work/err"'
check "sa list marks both as a nonce-reuse risk" '[ "$("$XESP" sa --db "$DB" list | grep -c "# nonce-reuse risk")" = 2 ]'
check "the marked list still loads as a batch" \
    '"$XESP" sa --db "$DB" list --show-keys >"$work/listed" && "$XESP" batch --db "$work/db2.conf" "$work/listed"'
check "an SA with its own key: no warning, no mark" \
    '"$XESP" sa --db "$DB" add src 192.0.2.1 dst 192.0.2.3 proto esp spi 0x3000 mode tunnel aead "rfc4106(gcm(aes))" 0x0f112233445566778899aabbccddeeff01020304 128 2>"$work/err" &&
     [ ! -s "$work/err" ] && ! "$XESP" sa --db "$DB" list | grep "spi 0x00003000" | grep -q nonce-reuse'
"$XESP" sa --db "$DB" flush

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
