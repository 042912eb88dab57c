"""`python -m raytrainer ...` is the `raytrainer` command (handy where only the source tree is shipped, as with
`ray job submit --working-dir .` on a cluster whose image lacks the console script)."""

import sys

from .cli.commands import main

sys.exit(main())
