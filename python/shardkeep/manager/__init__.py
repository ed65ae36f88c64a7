"""The checkpoint manager and its tiers: retention, preemption, leftovers
and the local tier with its peer copies. Built on saving and loading, and
on interop to resume from the Orbax steps under a root."""
