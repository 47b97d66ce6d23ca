"""rlsched inside the RL frameworks: drop-ins for their balancing functions.

:mod:`rlsched.integrations.verl` replaces verl's (``verl.utils.seqlen_balancing``)
with ``install()`` and restores them with ``uninstall()``.
"""
