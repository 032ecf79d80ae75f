"""`python -m lmprog.serve --model ...`: the same as `lmprog serve --model ...`."""

import sys

from .cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
