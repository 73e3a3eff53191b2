#!/usr/bin/env bash
# The main job, for real: a real trained model (PP-OCR's text-direction classifier) published
# to a local file registry, a real video rendered here, the agent run against a private
# mosquitto, and what it publishes printed by a subscriber that checks it against the video.
# `--tracking`: the tracking quick start instead (scripts/demo_tracking.sh: a shop's door counter).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    --tracking) exec scripts/demo_tracking.sh ;;
    "") ;;
    *) echo "usage: scripts/demo.sh [--tracking]" >&2; exit 2 ;;
esac
source scripts/setup.sh

WORK="$PWD/demo-work"
rm -rf "$WORK" && mkdir -p "$WORK"
source scripts/demo_broker.sh
PORT="$(free_port)"
MODEL="$(python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("rapidocr_onnxruntime").submodule_search_locations[0]) / "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")')"

echo "== 1. a video of text signs, some upside down (ground truth in $WORK/truth.json)"
python scripts/make_demo_video.py "$WORK/signs.mp4" --truth "$WORK/truth.json"

echo "== 2. publish the model to a file registry"
edge-agent registry publish "$MODEL" --name pp-ocr-text-direction --version 2.0 --registry "file://$WORK/registry"

echo "== 3. a private mosquitto on 127.0.0.1:$PORT"
BROKER=""
SUB=""
trap 'kill ${BROKER:-} ${SUB:-} 2>/dev/null || true' EXIT
start_broker "$WORK" "$PORT"

sed -e "s|@PORT@|$PORT|" -e "s|@WORK@|$WORK|g" configs/demo.yaml > "$WORK/agent.yaml"
edge-agent config validate "$WORK/agent.yaml"

echo "== 4. subscriber on edge/+/results/# and edge/+/status"
python scripts/demo_subscriber.py --port "$PORT" --truth "$WORK/truth.json" --ready-file "$WORK/sub.ready" &
SUB=$!
for _ in $(seq 100); do [ -e "$WORK/sub.ready" ] && break; sleep 0.1; done

echo "== 5. edge-agent run: it picks a backend (benchmarks the candidates on a real frame, checks"
echo "      their outputs against the CPU reference), then plays the 9 s video; it stops after 22 s"
edge-agent run -c "$WORK/agent.yaml" --duration 22 --log-level info 2> "$WORK/agent.log" &
AGENT=$!
wait $AGENT || { echo "edge-agent failed; its log:"; cat "$WORK/agent.log"; exit 1; }
wait $SUB
status=$?
echo
echo "Why the agent runs the model where it does (edge-agent explain):"
COLUMNS=${COLUMNS:-180} edge-agent explain sign-orientation -c "$WORK/agent.yaml"
echo "Agent log: $WORK/agent.log. Models in the store:"
COLUMNS=${COLUMNS:-180} edge-agent models list -c "$WORK/agent.yaml"
exit $status
