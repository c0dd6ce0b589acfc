"""`python -m dqn_cartpole`."""

import sys

from dqn_cartpole.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
