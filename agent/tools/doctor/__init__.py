"""`edge-agent doctor`: why does this box not work? One command that tries what the agent needs,
each check OK, WARN or FAIL with a one-line fix.

The checks are plain functions returning `Check`s; `run_doctor` runs them one after another, each
in a thread of its own with a time limit, so a broker or camera that hangs makes its row FAIL
instead of hanging the command. They try things the way the agent does (its config loader, MQTT
credentials, registry client, store verification, sources and backend choice), never its state:
doctor logs in to the broker with its own client id, reads cameras only when the agent is not
running them, and writes nothing into a state dir that belongs to another user.
"""
