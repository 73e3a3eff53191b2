"""Fleet management, the device side (what the daemon runs): desired state (desired.py), reconciling
and reported state (reconciler.py), commands (commands.py, device_commands.py). The protocol both
sides share is protocol.py (layers, cohorts, canonical bytes, envelopes) and document.py (what a
desired-state document is and its check); the operator's side (`edge-agent fleet ...`) is
agent/fleetctl/, which imports only those two from here."""
