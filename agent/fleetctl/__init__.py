"""The fleet controller, the operator's side of docs/fleet.md (what `edge-agent fleet ...` runs):
client.py (`FleetClient`: deploy, rollback, status, commands) over connection.py (the MQTT 5
connection and its retained snapshot), targets.py, results.py, records.py and status.py (what it
reads off the broker and returns), spec.py (deploy specs and the documents built from them) and
acl.py (the broker's ACL from an inventory). From agent/fleet/ it imports only the shared protocol
(protocol.py, document.py); no device module imports this package."""
