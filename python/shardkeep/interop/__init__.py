"""Reading other formats' checkpoints: Orbax (through tensorstore) and
PyTorch DCP (through torch), both optional dependencies imported only
when used, and safetensors (through the core); converting them to
shardkeep checkpoints. See docs/INTEROP.md. Imports every other folder
but manager, which reads Orbax steps under its root with it."""
