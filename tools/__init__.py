"""Tools that work on a checkout of the repository and are not installed with the package: the docs'
measured numbers generated from their reports (``docs.py``), and the built site checked in a browser
(``browse.py``). Run from the repository's root: ``python tools/docs.py build``."""
