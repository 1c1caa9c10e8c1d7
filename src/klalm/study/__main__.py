"""`python -m klalm.study` = `klalm-study`."""

import sys

from klalm.study.cli import main

if __name__ == "__main__":
    sys.exit(main())
