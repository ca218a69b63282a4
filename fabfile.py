from tasks import *  # noqa: F403  (fab looks for a fabfile; the tasks live in tasks.py)
