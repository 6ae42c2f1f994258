import sys

from dcost.cli import main

sys.exit(main())
