"""``python -m tilegemm``: the ``tilegemm`` command, for environments without its script on
PATH (a virtual environment not activated, ``pip install --user``)."""

import sys

from tilegemm.cli import main

sys.exit(main())
