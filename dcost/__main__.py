import sys

from dcost.cli.app import main

sys.exit(main())
