"""Loading: the load plan, its executor, and the sources it reads from
(the core's reader, with file mapping and load-and-broadcast). Imports
job, base and below; never saving."""
