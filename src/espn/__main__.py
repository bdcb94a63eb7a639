"""``python -m espn``: the ``espn`` command, for when the console script is not on ``PATH``."""

from espn.cli.main import main

if __name__ == "__main__":
    main()
