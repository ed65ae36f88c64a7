"""Per-call settings for ``gs://`` paths (``Options(gcs=GcsSettings(...))``).

Without them a ``gs://bucket/prefix`` path is reached the way Google's
libraries reach it: Application Default Credentials
(``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's
``application_default_credentials.json``, then the metadata server of a
GCE or TPU VM or a GKE pod), and ``STORAGE_EMULATOR_HOST`` for an emulator.
Each field set here wins over those. docs/GCS.md has the details.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GcsSettings:
    """Where and as whom ``gs://`` paths are reached; None fields come from
    the environment.

    Attributes:
      endpoint: the server, e.g. "https://storage.googleapis.com" (the
        default) or a private endpoint; without it ``STORAGE_EMULATOR_HOST``
        names an emulator, reached without credentials.
      credentials_file: a service-account or authorized-user key file (the
        JSON that ``gcloud`` writes), instead of Application Default
        Credentials. Its content never appears in an error or a log.
      anonymous: no credentials at all (public buckets, emulators).
    """

    endpoint: str | None = None
    credentials_file: str | None = None
    anonymous: bool | None = None

    def __post_init__(self):
        from .errors import InvalidArgumentError

        for name in ("endpoint", "credentials_file"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidArgumentError(
                    f"GcsSettings.{name} must be a non-empty str or None, got {value!r}")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise InvalidArgumentError(
                f"GcsSettings.endpoint must start with http:// or https://, got {self.endpoint!r}")
        if self.anonymous is not None and not isinstance(self.anonymous, bool):
            raise InvalidArgumentError(
                f"GcsSettings.anonymous must be a bool or None, got {self.anonymous!r}")
        if self.anonymous and self.credentials_file is not None:
            raise InvalidArgumentError(
                "GcsSettings takes credentials_file or anonymous=True, not both")

    def to_core(self):
        """The equivalent ``shardkeep._core.GcsOverrides``."""
        from . import _core  # Imported late so that this module stays importable alone.

        overrides = _core.GcsOverrides()
        for field in dataclasses.fields(self):
            setattr(overrides, field.name, getattr(self, field.name))
        return overrides
