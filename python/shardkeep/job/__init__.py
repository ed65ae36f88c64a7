"""The processes of one job: agreement on operation ids, barriers and the
byte exchange, over JAX's distributed runtime. Imports base and below."""
