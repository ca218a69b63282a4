"""etlab board agent: the one stable interface the workstation drives on a board.

Runs with the board's python3 (>= 3.8), the standard library and click only. Nothing here imports the
workstation's `orchestrator` package: board/ is pushed to boards on its own.
"""

AGENT_VERSION = "1"
