import sys

from specpair.cli import main

sys.exit(main())
