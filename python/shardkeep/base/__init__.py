"""Foundations that saving and loading share: dtypes, typed PRNG keys, the
tree's encoding, shardings, host memory, kinds of checkpointables. Imports
only the package's top-level modules (errors, options, _core)."""
