import sys

from shardsched.cli import main

sys.exit(main())
