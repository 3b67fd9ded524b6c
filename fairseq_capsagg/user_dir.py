"""Where the plugin lies: fairseq's ``--user-dir`` for it. A leaf: it imports nothing of the package."""

import os

USER_DIR = os.path.dirname(os.path.abspath(__file__))
