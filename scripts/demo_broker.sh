# Sourced by the demos (scripts/demo.sh, scripts/demo_tracking.sh): a private mosquitto on loopback.

# free_port: a TCP port free on 127.0.0.1 now.
free_port() {
    python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_broker WORK PORT: mosquitto on 127.0.0.1:PORT, anonymous, no persistence (its config and
# log in WORK); sets BROKER to its pid and returns once its port answers (5 s at most).
start_broker() {
    cat > "$1/mosquitto.conf" <<CONF
listener $2 127.0.0.1
allow_anonymous true
persistence false
CONF
    mosquitto -c "$1/mosquitto.conf" > "$1/mosquitto.log" 2>&1 &
    BROKER=$!
    for _ in $(seq 50); do (echo > "/dev/tcp/127.0.0.1/$2") 2>/dev/null && return 0; sleep 0.1; done
}
