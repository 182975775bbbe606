"""The lab's modes, one module each: ``dev`` (``dev``), ``train`` / ``train@`` (``train``), ``search`` / ``search@``
(``search``), ``enjoy@`` (``enjoy``), ``train --pbt-replay`` (``pbt_replay``); the spec check a ``train`` driver runs
in a child process (``spec_check``); what several modes share (``common``). Each runs an
``orchestrator.commandline.Command``; no mode imports another.
"""
