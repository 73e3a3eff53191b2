"""`python -m agent.cli`: the `edge-agent` command from a checkout."""

from agent.cli import main

main()
