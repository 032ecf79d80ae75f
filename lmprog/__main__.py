"""`python -m lmprog ...`: the `lmprog` command (`python -m lmprog serve --model ...`,
`python -m lmprog --version`)."""

import sys

from lmprog.serve.cli import main

sys.exit(main())
