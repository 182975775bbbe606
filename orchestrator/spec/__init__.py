"""Specs: reading spec files (``files``), the schema and its checks (``schema``), loading with overrides
(``load``), resume-edit rules (``resume``), SLM-Lab compatibility (``slm_lab``), the ``search`` section's syntax
(``search_space``), the tracking keys (``tracking_keys``) and the pre-run checks (``preflight``).

Kept light: importing ``orchestrator.spec`` loads nothing (``schema`` and ``load`` import torch via agents)."""
