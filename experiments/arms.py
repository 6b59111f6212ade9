"""Recipe arms: runs that differ by a few overrides, trained at once, and when each head left its
baseline. The tool is ``pretrainlab.tools.arms`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.arms import main

if __name__ == "__main__":
    sys.exit(main())
