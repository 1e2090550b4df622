"""`python -m jobs.scheduler.simulator --trace DIR --gpus N --policy fifo|backfill|slurm|fairshare [--json F]`."""

import sys

from jobs.scheduler.simulator.cli import main

sys.exit(main(sys.argv[1:]))
