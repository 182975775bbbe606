"""Storage layer: URIs and file systems (``storage``), the checkpoint store (``checkpoint``), run directories
(``predir``), the run's lease (``lease``) and its ``run.json`` record (``record``). Imports nothing above it."""
