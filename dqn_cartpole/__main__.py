"""`python -m dqn_cartpole`."""

import sys

from dqn_cartpole.cli.main import main
from dqn_cartpole.cli.roles import COMMANDS as ROLES
from dqn_cartpole.processes.exit_now import exit_now

if __name__ == "__main__":
    status = main()
    if len(sys.argv) > 1 and sys.argv[1] in ROLES:
        exit_now(status)  # a role's files are closed: no teardown, where a gone server's client can abort it
    sys.exit(status)
