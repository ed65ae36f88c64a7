"""Saving: staging arrays into host buffers, handing them to the core's
writer, and the saves still running in the background. Imports job, base
and below; never loading."""
