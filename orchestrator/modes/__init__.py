"""The lab's modes: ``dev`` (``dev``), ``train`` / ``train@`` (``train``), ``search`` / ``search@`` (``search``),
``enjoy@`` (``enjoy``), and the spec check a ``train`` driver runs in a child process (``spec_check``)."""
