"""Output formats behind one interface (``base.OutputFormat``), one module each; ``registry`` finds them:
``get(name)`` for ``--format``, ``of_shard`` for a file name. Adding a format is its module, one line in
``registry.FORMATS``, its tests, and the lists every format joins (setup.py's extra, the flag's choices, the
Flex Template, the docs). This file imports nothing: the formats' modules import ``base`` from here."""
