"""Hyperparameter search on Ray Tune, below the mode that drives it (``orchestrator.modes.search``): Tune's wiring
(``tune``), one search trial (``trials``) and the experiment's report (``report``)."""
