"""``python -m tilegemm``: the ``tilegemm`` command, for environments without its script on
PATH (a virtual environment not activated, ``pip install --user``)."""

import sys

from tilegemm.cli import main

if __name__ == "__main__":
    sys.exit(main())
