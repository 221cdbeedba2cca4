"""``python -m elasticdl.client``: the ``elasticdl`` command line."""

import sys

from elasticdl.client.main import main

sys.exit(main())
