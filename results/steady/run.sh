#!/bin/bash
# The steady-load run behind docs/bench/steady.md ("20 minutes of steady load" and "Pin release"; its files are in
# results/steady/e385496/): governor serve (default policy) under 22 minutes of constant greedy code at 3 QPS; at
# 1205 s an operator pins spec_method: off and releases the pin 20 s later.
# Run from the repository root: bash results/steady/run.sh OUT_FOLDER
set -u
D=${1:?output folder}; mkdir -p "$D"
export GOVERNOR_ADMIN_TOKEN=steadytok
U=http://127.0.0.1:8011; AUTH="Authorization: Bearer steadytok"
.venv/bin/governor serve --port 8011 --ep 1 --db "sqlite:///$D/g.db" > "$D/serve.log" 2>&1 &
SP=$!
until curl -sf $U/health > /dev/null; do sleep 2; done
date +%s > "$D/t0.txt"
.venv/bin/governor load --url $U --qps 3 --arrival constant --prompts code --temperature 0 --duration 1320 --quiet \
  --out "$D/load.json" > "$D/load.log" 2>&1 &
LP=$!
sleep 1205
curl -s -X PUT -H "$AUTH" -H 'Content-Type: application/json' $U/admin/config -d '{"spec_method":"off"}' > "$D/pin.json"
date +%s > "$D/pin_t.txt"
sleep 20
curl -s -X POST -H "$AUTH" $U/admin/release > "$D/release.json"
date +%s > "$D/release_t.txt"
for i in $(seq 1 45); do echo "$(date +%s) $(curl -s $U/admin/config)" >> "$D/after_release.txt"; sleep 2; done
wait $LP
for what in decisions history trials; do curl -s "$U/admin/$what?limit=1000" > "$D/$what.json"; done
kill $SP; wait $SP
