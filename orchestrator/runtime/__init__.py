"""Process runtime: the local Ray start (``ray_start``), the allocator (``allocator``), and every patch of a
private torch / Ray / pyarrow API, each in its own module with the version it was checked on and a fallback."""
