"""The session: one seed's RL loop (``loop``, Ray-free) and loading weights from another run (``transfer``)."""
