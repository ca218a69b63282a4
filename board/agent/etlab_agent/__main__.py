"""`python3 -m etlab_agent --workdir WD <command>`."""

from etlab_agent.cli import main

main()
