#!/usr/bin/env bash
# The tracking quick start (scripts/demo.sh --tracking runs it): a shop's door counter, for real. A
# clip rendered here (three people walk through a shop's door, one waits at the counter), a real
# trained detector from a wheel (nudenet's YOLOv8n, faces among its classes) run by `edge-agent run`
# with a door line and a counter zone against a private mosquitto; its events printed as they arrive
# and its counts checked against the clip's truth; then the same clip through
# `edge-agent infer --track --draw`, which leaves a video with the tracks, the zone and the line drawn.
# Exit 0 when every count agrees with the clip, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

# Its files (clip, config, logs, the drawn video, the snapshots) stay here to look at afterwards;
# EDGE_AGENT_DEMO_WORK names another folder, which must be empty or new (the tests use it).
if [ -n "${EDGE_AGENT_DEMO_WORK:-}" ]; then
    WORK="$(realpath -m "$EDGE_AGENT_DEMO_WORK")"
    mkdir -p "$WORK"
    [ -z "$(ls -A "$WORK")" ] || { echo "EDGE_AGENT_DEMO_WORK=$WORK is not empty" >&2; exit 2; }
else
    WORK="$PWD/demo-work/tracking"
    rm -rf "$WORK" && mkdir -p "$WORK"
fi
source scripts/demo_broker.sh
PORT="$(free_port)"
# A model file on the box (no registry): the wheel's, linked where the config names it.
ln -s "$(python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("nudenet").submodule_search_locations[0]) / "320n.onnx")')" "$WORK/320n.onnx"
sed -e "s|@PORT@|$PORT|" -e "s|@WORK@|$WORK|g" configs/demo-tracking.yaml > "$WORK/agent.yaml"

echo "== 1. a clip of a shop's door: three people walk through, one waits at the counter"
echo "      (what the door line and the counter zone should count: $WORK/truth.json)"
python scripts/make_tracking_video.py "$WORK/shop.avi" --config "$WORK/agent.yaml" --truth "$WORK/truth.json"

echo "== 2. the config: the detector, a door line and a counter zone ($WORK/agent.yaml)"
edge-agent config validate "$WORK/agent.yaml"

echo "== 3. a private mosquitto on 127.0.0.1:$PORT"
BROKER=""
SUB=""
AGENT=""
trap 'kill ${BROKER:-} ${SUB:-} ${AGENT:-} 2>/dev/null || true' EXIT
start_broker "$WORK" "$PORT"

echo "== 4. the events as they arrive (edge/demo-shop/events/shop and the status)"
python scripts/demo_tracking_events.py watch -c "$WORK/agent.yaml" --truth "$WORK/truth.json" \
    --ready-file "$WORK/sub.ready" &
SUB=$!
for _ in $(seq 100); do [ -e "$WORK/sub.ready" ] && break; sleep 0.1; done

echo "== 5. edge-agent run: it picks a backend for the detector, then plays the 18.5 s clip once"
edge-agent run -c "$WORK/agent.yaml" --log-level info 2> "$WORK/agent.log" &
AGENT=$!
status=0
wait $SUB || status=$?
kill -TERM $AGENT 2>/dev/null || true
wait $AGENT || { echo "edge-agent run failed; its log:"; cat "$WORK/agent.log"; exit 1; }
AGENT=""

echo
echo "== 6. the same clip, every frame, through edge-agent infer --track --draw"
edge-agent infer "$WORK/320n.onnx" "$WORK/shop.avi" --pipeline shop -c "$WORK/agent.yaml" --track \
    --draw "$WORK/tracked.mp4" --json > "$WORK/infer.json"
python scripts/demo_tracking_events.py infer "$WORK/infer.json" --truth "$WORK/truth.json" || status=1

echo
echo "To look at:"
echo "  the clip with the tracks, the door line and the counter drawn: $WORK/tracked.mp4"
echo "  each person's best picture (edge-agent run's snapshots):"
ls -1 "$WORK"/state/snapshots/shop/*.jpg 2>/dev/null | sed 's/^/    /' || echo "    (none)"
echo "  the agent's log: $WORK/agent.log; the config: $WORK/agent.yaml"
exit $status
