import sys

from elasticdl.server.main import main

sys.exit(main())
