"""Reporting: metrics (``metrics``), graphs (``graphs``), run analysis (``analysis``), statistics (``stats``),
``lab compare`` (``compare``), ``lab ls`` (``runs``), live progress (``progress``), the console's value and row
format (``rows``) and tracking backends (``tracking``). Reads committed run data; never changes a checkpoint."""
