import sys

from dlscope.cli import main

sys.exit(main())
